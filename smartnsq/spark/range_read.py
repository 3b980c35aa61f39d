"""One Spark task's read: the messages of one Youzan partition in a queue offset range.

The task makes a channel of its own on the partition leader, puts its cursor at ``start``
(``/channel/setoffset``), subscribes with ``SUB_ADVANCED`` (whose deliveries carry their
queue offset), FINs what it reads and stops at ``end``; then it deletes the channel. Other
channels of the topic are never touched, so the read is non-destructive and repeatable.

This module does not import pyspark: the caller gives the Arrow schema of the rows.
"""

from __future__ import annotations

import dataclasses
import select
import struct
import time
from collections.abc import Callable, Iterator

import pyarrow as pa

from smartnsq.errors import ConnectionClosed, NSQTimeout, error_from_frame
from smartnsq.protocol import commands
from smartnsq.protocol.frames import FRAME_ERROR, FRAME_MESSAGE, HEARTBEAT, OK
from smartnsq.protocol.handshake import ConnectionConfig
from smartnsq.protocol.message import MessageLayout, RawMessage, decode_message
from smartnsq.spark import youzan
from smartnsq.spark.columns import header_pairs, signed, timestamps
from smartnsq.spark.youzan import PartitionInfo
from smartnsq.sync.connection import SyncConnection

ROWS_PER_BATCH = 10_000
STALL_TIMEOUT = 60.0  # no message for this long while some are due: the task fails
_READ_SIZE = 1 << 20


def read_range(
    info: PartitionInfo,
    start: int,
    end: int,
    config: ConnectionConfig,
    channel_prefix: str,
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    """Arrow batches (``schema``) of the messages with ``start <= offset < end``."""
    if start >= end:
        return
    channel = youzan.task_channel(channel_prefix)
    youzan.open_channel(info, channel, start)
    try:
        yield from _read(info, start, end, channel, config, schema)
    finally:
        youzan.delete_channel(info, channel)


class _Rows:
    """The columns of the rows read so far, filled straight from the frames."""

    __slots__ = ("attempts", "bodies", "headers", "ids", "offsets", "stamps", "traces")

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.offsets: list[int] = []
        self.stamps: list[int] = []  # nanoseconds
        self.attempts: list[int] = []
        self.ids: list[bytes] = []
        self.traces: list[int] = []
        self.headers: list[list[tuple[str, str]]] | None = None  # ext topics only

    def __len__(self) -> int:
        return len(self.offsets)


# timestamp, attempts, internal id, trace id (signed: Spark's long), queue offset, raw size
_PLAIN = struct.Struct(">qHQqQI")


def _read(
    info: PartitionInfo,
    start: int,
    end: int,
    channel: str,
    config: ConnectionConfig,
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    config = dataclasses.replace(config, extend_support=True if info.ext else None)
    # The connection is ours alone from here on: a plain read loop, no request queue.
    own = SyncConnection.open(info.nsqd, config, config.connect_timeout).detach(STALL_TIMEOUT)
    sock = own.sock
    decoder = own.decoder
    compress: Callable[[bytes], bytes] = own.compress or _same
    decompress: Callable[[bytes], bytes] = own.decompress or _same
    layout = MessageLayout(binary_id=True, ext=True, offset=True)
    unpack = _PLAIN.unpack_from
    try:
        # Four tokens: the fork ignores the partition of a SUB_ADVANCED that also has a start.
        # An ordered topic takes SUB_ORDERED only (E_SUB_ORDER_IS_MUST); its deliveries carry
        # their queue offsets too, one message at a time.
        sub = "SUB_ORDERED" if info.ordered else "SUB_ADVANCED"
        line = f"{sub} {info.topic} {channel} {info.partition}\n".encode()
        sock.sendall(compress(line))
        subscribed = False
        rows = _new_rows(info)
        expect = start  # the next message must be at or after this offset
        last_data = time.monotonic()
        done = False
        while not done:
            ready, _, _ = select.select([sock], [], [], 1.0)
            if not ready:
                if time.monotonic() - last_data > STALL_TIMEOUT:
                    raise NSQTimeout(
                        f"partition {info.partition} of {info.topic!r} on nsqd {info.nsqd}: "
                        f"no message for {STALL_TIMEOUT:.0f} s while reading offsets "
                        f"{expect} to {end}"
                    )
                continue
            data = sock.recv(_READ_SIZE)
            if not data:
                raise ConnectionClosed(f"nsqd {info.nsqd} closed the connection mid-read")
            last_data = time.monotonic()
            buf, spans = decoder.feed_spans(decompress(data))
            out: list[bytes] = []  # FINs, and the odd NOP or RDY
            for ftype, lo, hi in spans:
                if ftype == FRAME_MESSAGE:
                    if done:
                        continue  # sent before nsqd saw us stop: the channel goes anyway
                    message_id = buf[lo + 10 : lo + 26]
                    out.append(b"FIN " + message_id + b"\n")
                    if rows.headers is None:
                        stamp, tries, _, trace, offset, size = unpack(buf, lo)
                        body = buf[lo + 38 : hi]
                    else:
                        msg = decode_message(buf[lo:hi], layout, RawMessage)
                        stamp, tries, trace = msg.timestamp, msg.attempts, signed(msg.trace_id)
                        offset, size, body = msg.offset or 0, msg.raw_size or 1, msg.body
                    if offset < expect:
                        continue  # a redelivery of what we already have
                    if offset >= end:
                        done = True
                        continue
                    rows.bodies.append(body)
                    rows.offsets.append(offset)
                    rows.stamps.append(stamp)
                    rows.attempts.append(tries)
                    rows.ids.append(message_id)
                    rows.traces.append(trace)
                    if rows.headers is not None:
                        rows.headers.append(header_pairs(msg))
                    expect = offset + size
                    done = expect >= end
                    if len(rows) >= ROWS_PER_BATCH:
                        yield to_batch(rows, info, schema)
                        rows = _new_rows(info)
                elif ftype == FRAME_ERROR:
                    raise error_from_frame(buf[lo:hi])
                else:
                    payload = buf[lo:hi]
                    if payload == HEARTBEAT:
                        out.append(commands.NOP)
                    elif payload == OK and not subscribed:
                        subscribed = True
                        out.append(commands.rdy(own.features.max_rdy_count))
            if out and not done:
                sock.sendall(compress(b"".join(out)))
        if len(rows):
            yield to_batch(rows, info, schema)
    finally:
        sock.close()


def _new_rows(info: PartitionInfo) -> _Rows:
    rows = _Rows()
    if info.ext:
        rows.headers = []
    return rows


def _same(data: bytes) -> bytes:
    return data


def to_batch(rows: _Rows, info: PartitionInfo, schema: pa.Schema) -> pa.RecordBatch:
    """The rows of one partition in exactly ``schema``."""
    n = len(rows)
    columns: dict[str, Callable[[pa.DataType], pa.Array]] = {
        "value": lambda t: pa.array(rows.bodies, type=t),
        "topic": lambda t: pa.array([info.topic] * n, type=t),
        "partition": lambda t: pa.array([info.partition] * n, type=t),
        "offset": lambda t: pa.array(rows.offsets, type=t),
        "timestamp": lambda t: timestamps(rows.stamps, t),
        "attempts": lambda t: pa.array(rows.attempts, type=t),
        "id": lambda t: pa.array([i.hex() for i in rows.ids], type=t),
        "trace_id": lambda t: pa.array(rows.traces, type=t),
        "headers": lambda t: pa.array(rows.headers or [[]] * n, type=t),
        "nsqd": lambda t: pa.array([info.nsqd] * n, type=t),
    }
    arrays = [columns[f.name](f.type) for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
