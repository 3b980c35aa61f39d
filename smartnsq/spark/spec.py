"""The offset options' values (``startingOffsets``/``endingOffsets`` and the timestamps),
parsed and checked; shared by :mod:`~smartnsq.spark.options` (which parses every option) and
:mod:`~smartnsq.spark.offsets_plan` (which resolves them against a topic).

This module does not import pyspark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from smartnsq.errors import InvalidArgument
from smartnsq.protocol.offsets import MAX_TIMESTAMP

EARLIEST, LATEST = -2, -1  # as in Kafka's JSON offsets


@dataclass(frozen=True)
class At:
    """``startingTimestamp`` / ``endingTimestamp``: a Unix time in milliseconds, as in Kafka.
    The fork finds whole seconds: the first message published at or after the start of the
    second that holds it."""

    ms: int


Spec = Literal["earliest", "latest"] | dict[int, int] | At
Offsets = dict[int, int]


def parse_spec(option: str, value: str, topic: str, *, ending: bool) -> Spec:
    """``earliest``, ``latest`` or ``{"<topic>": {"<partition>": <offset>}}``, checked."""
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        word = text.lower()
        if ending and word == "earliest":
            raise InvalidArgument(f"option {option!r} cannot be 'earliest': use 'latest' or JSON")
        return "earliest" if word == "earliest" else "latest"
    try:
        data = json.loads(text)
    except ValueError:
        raise InvalidArgument(
            f"option {option!r} must be earliest, latest or JSON like "
            f'{{"{topic}": {{"0": 42}}}}, not {value!r}'
        ) from None
    if not isinstance(data, dict) or set(data) != {topic}:
        raise InvalidArgument(
            f"option {option!r} must be a JSON object with the one key {topic!r} (the topic "
            f'read), like {{{json.dumps(topic)}: {{"0": 42}}}}, not {value!r}'
        )
    per = data[topic]
    if not isinstance(per, dict) or not per:
        raise InvalidArgument(
            f"option {option!r}: {topic!r} must map partition numbers to offsets, not {per!r}"
        )
    out: dict[int, int] = {}
    for key, offset in per.items():
        if not key.isdigit():
            raise InvalidArgument(f"option {option!r}: partition {key!r} is not a number")
        lowest = LATEST if ending else EARLIEST
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < lowest:
            meaning = "-1 (latest)" if ending else "-2 (earliest), -1 (latest)"
            raise InvalidArgument(
                f"option {option!r}: the offset of partition {key} must be a queue offset "
                f">= 0 or {meaning}, not {offset!r}"
            )
        out[int(key)] = offset
    return out


def parse_time(option: str, value: str) -> At:
    try:
        ms = int(value.strip())
    except ValueError:
        ms = -1
    if not 0 <= ms <= MAX_TIMESTAMP * 1000:
        raise InvalidArgument(
            f"option {option!r} must be a Unix time in milliseconds (like Kafka's), not {value!r}"
        )
    return At(ms)


def option_name(spec: Spec | None, *, ending: bool) -> str:
    if isinstance(spec, At):
        return "endingTimestamp" if ending else "startingTimestamp"
    return "endingOffsets" if ending else "startingOffsets"
