"""One Spark task's read: the messages of one Youzan partition in a queue offset range.

The task makes a channel of its own on the partition leader, puts its cursor at ``start``
(``/channel/setoffset``), subscribes with ``SUB_ADVANCED`` (whose deliveries carry their
queue offset), FINs what it reads and stops at ``end``; then it deletes the channel. Other
channels of the topic are never touched, so the read is non-destructive and repeatable.

This module does not import pyspark: the caller gives the Arrow schema of the rows.
"""

from __future__ import annotations

import dataclasses
import json
import select
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from smartnsq.errors import ConnectionClosed, NSQTimeout, error_from_frame
from smartnsq.protocol import commands
from smartnsq.protocol.frames import FRAME_ERROR, FRAME_MESSAGE, HEARTBEAT, OK
from smartnsq.protocol.handshake import ConnectionConfig
from smartnsq.protocol.message import MessageLayout, RawMessage, decode_message
from smartnsq.spark import youzan
from smartnsq.spark.youzan import PartitionInfo
from smartnsq.sync.connection import SyncConnection

ROWS_PER_BATCH = 10_000
STALL_TIMEOUT = 60.0  # no message for this long while some are due: the task fails
_READ_SIZE = 1 << 20


def task_channel(prefix: str) -> str:
    """A channel name no other reader uses (nsqd allows 64 characters)."""
    return f"{prefix[:40]}-{uuid.uuid4().hex[:16]}"


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
    channel = task_channel(channel_prefix)
    youzan.open_channel(info, channel, start)
    try:
        yield from _read(info, start, end, channel, config, schema)
    finally:
        youzan.delete_channel(info, channel)


def _read(
    info: PartitionInfo,
    start: int,
    end: int,
    channel: str,
    config: ConnectionConfig,
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    config = dataclasses.replace(config, extend_support=True if info.ext else None)
    conn = SyncConnection.open(info.nsqd, config, config.connect_timeout)
    # The connection is ours alone from here on: a plain read loop, no request queue.
    sock: socket.socket = conn._sock
    decoder = conn._decoder
    compress: Callable[[bytes], bytes] = conn._compress or _same
    decompress: Callable[[bytes], bytes] = conn._decompress or _same
    layout = MessageLayout(binary_id=True, ext=info.ext, offset=True)
    try:
        # Four tokens: the fork ignores the partition of a SUB_ADVANCED that also has a start.
        line = f"SUB_ADVANCED {info.topic} {channel} {info.partition}\n".encode()
        sock.sendall(compress(line))
        subscribed = False
        messages: list[RawMessage] = []
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
            fins: list[bytes] = []
            for ftype, lo, hi in spans:
                if ftype == FRAME_MESSAGE:
                    if done:
                        continue  # sent before nsqd saw us stop: the channel goes anyway
                    msg = decode_message(buf[lo:hi], layout, RawMessage)
                    fins.append(commands.fin(msg.id))
                    offset = msg.offset or 0
                    if offset < expect:
                        continue  # a redelivery of what we already have
                    if offset >= end:
                        done = True
                        continue
                    messages.append(msg)
                    expect = offset + (msg.raw_size or 1)
                    done = expect >= end
                    if len(messages) >= ROWS_PER_BATCH:
                        yield to_batch(messages, info, schema)
                        messages = []
                elif ftype == FRAME_ERROR:
                    raise error_from_frame(buf[lo:hi])
                else:
                    payload = buf[lo:hi]
                    if payload == HEARTBEAT:
                        fins.append(commands.NOP)
                    elif payload == OK and not subscribed:
                        subscribed = True
                        fins.append(commands.rdy(conn.features.max_rdy_count))
            if fins and not done:
                sock.sendall(compress(b"".join(fins)))
        if messages:
            yield to_batch(messages, info, schema)
    finally:
        conn._abort(None)


def _same(data: bytes) -> bytes:
    return data


def _signed(value: int) -> int:
    # Youzan trace ids are unsigned 64-bit; Spark's long is signed.
    return value - (1 << 64) if value >= 1 << 63 else value


def _headers(msg: RawMessage) -> list[tuple[str, str]]:
    return [(k, v if isinstance(v, str) else json.dumps(v)) for k, v in msg.headers.items()]


def to_batch(messages: list[RawMessage], info: PartitionInfo, schema: pa.Schema) -> pa.RecordBatch:
    """The rows of ``messages`` (all of partition ``info``) in exactly ``schema``."""
    n = len(messages)
    columns: dict[str, Callable[[], list[Any]]] = {
        "value": lambda: [m.body for m in messages],
        "topic": lambda: [info.topic] * n,
        "partition": lambda: [info.partition] * n,
        "offset": lambda: [m.offset for m in messages],
        "timestamp": lambda: [m.timestamp // 1000 for m in messages],
        "attempts": lambda: [m.attempts for m in messages],
        "id": lambda: [m.id.hex() for m in messages],
        "trace_id": lambda: [_signed(m.trace_id) for m in messages],
        "headers": lambda: [_headers(m) for m in messages],
        "nsqd": lambda: [info.nsqd] * n,
    }
    arrays = [pa.array(columns[f.name](), type=f.type) for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
