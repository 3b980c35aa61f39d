"""What the Spark source needs to know about a Youzan partitioned topic, over plain HTTP.

The driver asks lookupd about the topic (partitioned? ext?) and each partition leader's
``/stats`` for its queue offsets. A task reads a range through a channel of its own (see
:mod:`smartnsq.spark.range_read`), made and removed here with the nsqd channel endpoints.

This module does not import pyspark.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from smartnsq.errors import LookupFailed, NsqdHttpFailed, NSQError, TopicNotFound
from smartnsq.lookup.client import ACCEPT, MAX_RESPONSE_SIZE
from smartnsq.lookup.model import TopicLayout, loads, parse_lookup
from smartnsq.net.http import HttpError, Response, request_blocking
from smartnsq.offsets import (
    SETTLE_PAUSE,
    SETTLE_TRIES,
    http_address,
    leader_numbers,
    partition_leaders,
    stats_params,
)
from smartnsq.protocol.offsets import PartitionNumbers

log = logging.getLogger("smartnsq.spark")

HTTP_TIMEOUT = 10.0


@dataclass(frozen=True)
class PartitionInfo:
    """One partition as its leader reports it (the fields of ``smartnsq.PartitionOffsets``
    that the source uses, plus the topic's kind)."""

    topic: str
    partition: int
    nsqd: str  # TCP address of the leader
    http: str  # HTTP address of the leader
    earliest: int  # queue offset of the earliest retained message
    end: int  # queue offset just past the last message
    end_count: int  # messages ever written to the partition
    ext: bool
    ordered: bool

    def offsets_per_message(self) -> float:
        """The partition's average stored message size in queue offsets (at least 1)."""
        return max(1.0, self.end / self.end_count) if self.end_count else 1.0


def _request(method: str, url: str, params: dict[str, str], body: bytes | None = None) -> Response:
    return request_blocking(
        method, url, params, ACCEPT, body, timeout=HTTP_TIMEOUT, max_size=MAX_RESPONSE_SIZE
    )


def _get(url: str, params: dict[str, str]) -> tuple[int, Any]:
    try:
        r = _request("GET", url, params)
    except HttpError as exc:
        raise LookupFailed(f"{url} unreachable: {exc}") from exc
    try:
        return r.status, loads(r.body) if r.body else None
    except ValueError:
        return r.status, None


def topic_layout(lookupd: tuple[str, ...], topic: str) -> TopicLayout | None:
    """The topic as the first answering lookupd sees it; None where lookupd does not know it
    (classic lookupd answers 404; the fork answers with no partitions)."""
    last: Exception | None = None
    for base in lookupd:
        try:
            status, body = _get(
                f"{base}/lookup", {"topic": topic, "access": "r", "metainfo": "true"}
            )
        except LookupFailed as exc:
            last = exc
            continue
        if status == 404 or (status == 500 and "TOPIC_NOT_FOUND" in str(body)):
            return None
        if status != 200 or body is None:
            last = LookupFailed(f"lookupd {base} answered HTTP {status} for topic {topic!r}")
            continue
        layout = parse_lookup(body)
        return layout if layout.producers or layout.partitions else None
    raise LookupFailed(f"no lookupd answered for topic {topic!r}: {last}")


def partitions(lookupd: tuple[str, ...], topic: str) -> list[PartitionInfo]:
    """Every partition of ``topic`` with its leader's current queue offsets.

    Blocking calls on this process's kept client: the driver asks this for every micro-batch,
    and :func:`smartnsq.sync.partition_offsets` (an event loop and new clients per call)
    took 60-80 ms of each.
    """
    layout = topic_layout(lookupd, topic)
    if layout is None or not layout.partitions:
        raise TopicNotFound(f"lookupd knows no partitions of topic {topic!r}")
    meta = layout.meta
    infos = []
    for partition, node in sorted(partition_leaders(topic, layout).items()):
        http = http_address(node)
        n = _stats(http, topic, partition, None)
        infos.append(
            PartitionInfo(
                topic=topic,
                partition=partition,
                nsqd=node.tcp_address,
                http=http,
                earliest=n.earliest,
                end=n.end,
                end_count=n.end_count,
                ext=bool(meta and meta.extend_support),
                ordered=bool(meta and meta.ordered),
            )
        )
    return infos


def _stats(http: str, topic: str, partition: int, channel: str | None) -> PartitionNumbers:
    url = f"http://{http}/stats"
    try:
        r = _request("GET", url, stats_params(topic, partition, channel))
    except HttpError as exc:
        raise NsqdHttpFailed(f"nsqd {url} unreachable: {exc}") from exc
    if r.status != 200:
        raise NsqdHttpFailed(f"nsqd {url} answered HTTP {r.status}: {_text(r)}")
    return leader_numbers(r.body, http, topic, partition, channel)


def _post(http: str, path: str, params: dict[str, str], body: bytes = b"") -> None:
    try:
        r = _request("POST", f"http://{http}{path}", params, body)
    except HttpError as exc:
        raise LookupFailed(f"nsqd {http}: {path} failed: {exc}") from exc
    if r.status != 200:
        raise LookupFailed(f"nsqd {http}: {path} answered HTTP {r.status}: {_text(r)}")


def _text(r: Response) -> str:
    return r.body[:200].decode("utf-8", "replace")


def _channel_params(info: PartitionInfo, channel: str) -> dict[str, str]:
    return {"topic": info.topic, "partition": str(info.partition), "channel": channel}


def task_channel(prefix: str) -> str:
    """A channel name no other reader uses (nsqd allows 64 characters), stamped with its
    creation time so that one left behind can be told from one in use (see
    :func:`remove_orphans`)."""
    return f"{prefix[:40]}-{int(time.time()):08x}{uuid.uuid4().hex[:8]}"


def offsets_at_time(infos: list[PartitionInfo], seconds: int, prefix: str) -> dict[int, int]:
    """Per partition, the queue offset of the first message published at or after the start
    of Unix second ``seconds`` (the partition's end when there is none).

    The fork does the search itself (``/channel/setoffset timestamp:<seconds>``), but a
    channel takes its new position later, in its own goroutine: read at once, a channel that
    has not moved yet looks like one moved to where it was. So two throw-away channels are
    moved, one first parked at the earliest offset and one left at the end (where a new
    channel starts): they show the same position only once that is the answer.
    """
    out: dict[int, int] = {}
    for info in infos:
        if info.earliest >= info.end:  # nothing retained: every time is the end
            out[info.partition] = info.end
            continue
        low, high = task_channel(prefix), task_channel(prefix)
        made: list[str] = []
        try:
            for channel in (low, high):
                made.append(channel)
                _post(info.http, "/channel/create", _channel_params(info, channel))
            _post(
                info.http,
                "/channel/setoffset",
                _channel_params(info, low),
                b"virtual_queue:%d" % info.earliest,
            )
            # (the predicates run before _positions returns: the loop variable is current)
            parked = _positions(info, (low, high), lambda at: at[0] == info.earliest)  # noqa: B023
            if parked[1] == info.earliest:
                raise NsqdHttpFailed(
                    f"nsqd {info.http}: a new channel of {info.topic!r} partition "
                    f"{info.partition} starts at its earliest offset, not its end"
                )
            for channel in (low, high):
                _post(
                    info.http,
                    "/channel/setoffset",
                    _channel_params(info, channel),
                    b"timestamp:%d" % seconds,
                )
            out[info.partition] = _positions(info, (low, high), lambda at: at[0] == at[1])[0]
        finally:
            for channel in made:
                delete_channel(info, channel)
    return out


def _positions(
    info: PartitionInfo, channels: tuple[str, ...], done: Callable[[list[int]], bool]
) -> list[int]:
    """The channels' positions once each is settled (has seen the topic's end) and
    ``done(positions)``; NsqdHttpFailed when that does not come within the settle time."""
    for _ in range(SETTLE_TRIES):
        numbers = [_stats(info.http, info.topic, info.partition, c) for c in channels]
        at = [n.channel_offset for n in numbers]
        if None in at:
            raise NsqdHttpFailed(f"nsqd {info.http} does not report channels {channels}")
        found = cast(list[int], at)
        if all(n.settled for n in numbers) and done(found):
            return found
        time.sleep(SETTLE_PAUSE)
    raise NsqdHttpFailed(
        f"nsqd {info.http}: channels {channels} of {info.topic!r} partition {info.partition} "
        f"did not take their positions in {SETTLE_TRIES * SETTLE_PAUSE:.1f} s; try again"
    )


def open_channel(info: PartitionInfo, channel: str, start: int) -> int:
    """Create ``channel`` on the partition leader, its cursor at the first message whose
    queue offset is >= ``start``; return that message's offset (the partition's end when
    there is none) once nsqd shows the channel there.

    ``/channel/setoffset`` answers before the channel moves (see :func:`offsets_at_time`):
    subscribed at once, a reader could be sent messages from where a new channel starts,
    the end, and take them for the end of its range.
    """
    params = _channel_params(info, channel)
    _post(info.http, "/channel/create", params)
    if info.ordered:
        # Ordered before anything is read: a channel that turns ordered on its first
        # SUB_ORDERED moves its cursor back (and delivers its first message twice).
        _post(info.http, "/channel/setorder", {**params, "order": "true"})
    only = (channel,)
    [first] = _positions(info, only, lambda at: True)
    # virtual_queue:<n> puts the cursor on the first message at or after n, n need not be a
    # message boundary (checked against the fork, which has no documentation for it).
    _post(info.http, "/channel/setoffset", params, b"virtual_queue:%d" % start)
    try:
        return _positions(info, only, lambda at: at[0] != first)[0]
    except NsqdHttpFailed:
        pass
    # Still where it started: not moved yet, or moved to where it was (no message from
    # ``start`` on). Parked at the earliest offset first, a move is always seen.
    _post(info.http, "/channel/setoffset", params, b"virtual_queue:%d" % info.earliest)
    [parked] = _positions(info, only, lambda at: at[0] != first)
    if start <= parked:
        return parked
    _post(info.http, "/channel/setoffset", params, b"virtual_queue:%d" % start)
    return _positions(info, only, lambda at: at[0] != parked)[0]


def delete_channel(info: PartitionInfo, channel: str) -> None:
    """Remove ``channel``; a failure is logged, never raised (the rows are already read)."""
    params = _channel_params(info, channel)
    try:
        _post(info.http, "/channel/delete", params)
    except NSQError as exc:
        log.warning("could not delete channel %s of %s: %s", channel, info.topic, exc)


ORPHAN_AGE = 600.0  # a task's channel unused this long was left by a task that died


def remove_orphans(infos: list[PartitionInfo], prefix: str) -> None:
    """Delete task channels (``<prefix>-<created><random>``) that nobody is subscribed to
    and that are older than :data:`ORPHAN_AGE`: an unread channel makes nsqd keep data."""
    if not infos:
        return
    topic = infos[0].topic
    pattern = re.compile(re.escape(prefix[:40]) + r"-([0-9a-f]{8})[0-9a-f]{8}")
    now = time.time()
    by_partition = {i.partition: i for i in infos}
    for http in {i.http for i in infos}:
        status, body = _get(f"http://{http}/stats", {"format": "json", "topic": topic})
        if status != 200 or not isinstance(body, dict):
            continue
        for t in body.get("topics") or []:
            info = by_partition.get(int(t.get("topic_partition", -1)))
            if t.get("topic_name") != topic or info is None or info.http != http:
                continue
            for c in t.get("channels") or []:
                found = pattern.fullmatch(str(c.get("channel_name", "")))
                if found and not c.get("client_num") and now - int(found[1], 16) > ORPHAN_AGE:
                    log.warning("deleting channel %s of %s left by a failed task", found[0], info)
                    delete_channel(info, found[0])
