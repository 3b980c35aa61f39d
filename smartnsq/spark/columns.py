"""Column values shared by the source's readers (no pyspark here: tasks import it cheaply)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pyarrow as pa

from smartnsq.protocol.message import RawMessage


def signed(value: int) -> int:
    """A Youzan trace id (unsigned 64-bit) as Spark's long (signed)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def header_pairs(msg: RawMessage) -> list[tuple[str, str]]:
    """A message's ext headers as the source's map<string,string> (non-text values as JSON)."""
    return [(k, v if isinstance(v, str) else json.dumps(v)) for k, v in msg.headers.items()]


def timestamps(nanoseconds: Sequence[int], t: pa.DataType) -> pa.Array:
    """nsqd's message times (nanoseconds) as Spark's timestamp column ``t``."""
    return pa.array(nanoseconds, type=pa.timestamp("ns", tz="UTC")).cast(t, safe=False)
