"""Offsets of a Youzan topic as Spark keeps them: ``{"<topic>": {"<partition>": <offset>}}``.

An offset is a queue offset (the unit of ``Message.offset``), and a range ``[start, end)``
holds the messages whose offset is in it. Spark stores these dicts in the checkpoint; this
module resolves the user's ``startingOffsets``/``endingOffsets`` (parsed in
:mod:`~smartnsq.spark.spec`) against the partitions' current offsets and spreads a
per-trigger limit over the partitions.

This module does not import pyspark.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Literal

from smartnsq.errors import DataLoss, InvalidArgument
from smartnsq.spark import youzan
from smartnsq.spark.options import DEFAULT_CHANNEL_PREFIX, Settings
from smartnsq.spark.range_read import Range
from smartnsq.spark.spec import (
    EARLIEST,
    LATEST,
    At,
    Offsets,
    Spec,
    option_name,
    parse_spec,
    parse_time,
)
from smartnsq.spark.youzan import PartitionInfo

# Re-exported: the offset options are parsed in smartnsq.spark.spec (options needs them too).
__all__ = [
    "EARLIEST",
    "LATEST",
    "At",
    "Offsets",
    "Spec",
    "check_retained",
    "from_spark",
    "group",
    "option_name",
    "parse_spec",
    "parse_time",
    "resolve",
    "resolve_end",
    "resolve_start",
    "spread",
    "to_spark",
]

log = logging.getLogger("smartnsq.spark")


def resolve_start(
    settings: Settings, infos: Sequence[PartitionInfo], default: Literal["earliest", "latest"]
) -> Offsets:
    """The starting offsets the options ask for (``startingOffsets`` or
    ``startingTimestamp``; ``default`` when neither is given)."""
    spec = settings.starting_offsets or default
    return resolve(option_name(spec, ending=False), spec, infos, settings.channel_prefix)


def resolve_end(settings: Settings, infos: Sequence[PartitionInfo]) -> Offsets:
    spec = settings.ending_offsets or "latest"
    return resolve(option_name(spec, ending=True), spec, infos, settings.channel_prefix)


def resolve(
    option: str,
    spec: Spec,
    infos: Sequence[PartitionInfo],
    channel_prefix: str = DEFAULT_CHANNEL_PREFIX,
) -> Offsets:
    """Per-partition queue offsets for ``spec`` now; an error names ``option``.

    A time is looked up through a throw-away channel named after ``channel_prefix``."""
    known = {i.partition: i for i in infos}
    if isinstance(spec, At):
        return youzan.offsets_at_time(list(infos), spec.ms // 1000, channel_prefix)
    if spec == "earliest":
        return {p: i.earliest for p, i in known.items()}
    if spec == "latest":
        return {p: i.end for p, i in known.items()}
    unknown = sorted(set(spec) - set(known))
    if unknown:
        raise InvalidArgument(
            f"option {option!r} names partition(s) {unknown} that topic "
            f"{infos[0].topic!r} does not have (it has {sorted(known)})"
        )
    missing = sorted(set(known) - set(spec))
    if missing:
        raise InvalidArgument(
            f"option {option!r} gives no offset for partition(s) {missing} of topic "
            f"{infos[0].topic!r}: give every partition (-2 earliest, -1 latest)"
        )
    out: Offsets = {}
    for p, offset in spec.items():
        info = known[p]
        if offset == EARLIEST:
            out[p] = info.earliest
        elif offset == LATEST:
            out[p] = info.end
        elif offset > info.end:
            raise InvalidArgument(
                f"option {option!r}: offset {offset} of partition {p} is past its end ({info.end})"
            )
        else:
            out[p] = offset
    return out


def check_retained(
    start: Offsets, infos: Sequence[PartitionInfo], fail_on_data_loss: bool
) -> Offsets:
    """``start`` with every offset below what nsqd still retains raised to the earliest
    retained one, or :class:`DataLoss` if ``fail_on_data_loss``."""
    out = dict(start)
    for info in infos:
        offset = start.get(info.partition)
        if offset is None or offset >= info.earliest:
            continue
        text = (
            f"partition {info.partition} of topic {info.topic!r}: offsets {offset} to "
            f"{info.earliest} are no longer retained by nsqd"
        )
        if fail_on_data_loss:
            raise DataLoss(f"{text}; set failOnDataLoss=false to skip them")
        log.warning("%s; skipped (failOnDataLoss=false)", text)
        out[info.partition] = info.earliest
    return out


def spread(
    max_messages: int, start: Offsets, end: Offsets, infos: Sequence[PartitionInfo]
) -> Offsets:
    """``end`` cut so that about ``max_messages`` messages are read in all, shared among the
    partitions in proportion to their backlog. A message is counted as the partition's
    average stored size, so the cut is exact for messages of one size."""
    per = {i.partition: i.offsets_per_message() for i in infos}
    backlog = {p: max(0, e - start.get(p, e)) / per.get(p, 1.0) for p, e in end.items()}
    total = sum(backlog.values())
    if total <= max_messages:
        return dict(end)
    out = dict(end)
    for p, messages in backlog.items():
        if not messages:
            continue
        share = max(1, int(max_messages * messages / total))
        out[p] = min(end[p], start[p] + round(share * per.get(p, 1.0)))
    return out


def to_spark(topic: str, offsets: Mapping[int, int]) -> dict[str, dict[str, int]]:
    return {topic: {str(p): int(o) for p, o in sorted(offsets.items())}}


def from_spark(topic: str, data: Mapping[str, Mapping[str, int]]) -> Offsets:
    if topic not in data:
        raise InvalidArgument(
            f"the checkpoint holds offsets of topic(s) {sorted(data)}, not of {topic!r}: "
            "a checkpoint belongs to one query; use a new checkpointLocation"
        )
    return {int(p): int(o) for p, o in data[topic].items()}


def group(ranges: Sequence[Range], per_task: int) -> list[tuple[Range, ...]]:
    """The tasks of a read: ``ranges`` in as few groups of at most ``per_task`` as that
    allows, the longest ranges placed first, each on the group with the fewest offsets so
    far, so that the tasks carry similar amounts."""
    tasks: list[list[Range]] = [[] for _ in range(-(-len(ranges) // per_task))]
    sizes = [0] * len(tasks)
    for r in sorted(ranges, key=lambda r: (r.start - r.end, r.info.partition)):
        i = min((i for i, t in enumerate(tasks) if len(t) < per_task), key=sizes.__getitem__)
        tasks[i].append(r)
        sizes[i] += r.end - r.start
    ordered = [tuple(sorted(t, key=lambda r: r.info.partition)) for t in tasks]
    return sorted(ordered, key=lambda t: t[0].info.partition)
