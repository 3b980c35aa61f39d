"""One Spark task's read: the messages of Youzan partitions in queue offset ranges.

For each range the task makes a channel of its own on the partition leader, puts its cursor
at ``start`` (``/channel/setoffset``), subscribes with ``SUB_ADVANCED`` (whose deliveries
carry their queue offset), FINs what it reads and stops at ``end``; then it deletes the
channel. Other channels of the topic are never touched, so the read is non-destructive and
repeatable.

This module does not import pyspark: the caller gives the Arrow schema of the rows.
"""

from __future__ import annotations

import dataclasses
import select
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from smartnsq.errors import ConnectionClosed, NSQTimeout, ProtocolError, error_from_frame
from smartnsq.protocol import commands
from smartnsq.protocol.frames import FRAME_ERROR, FRAME_MESSAGE, HEARTBEAT, OK
from smartnsq.protocol.handshake import ConnectionConfig
from smartnsq.protocol.message import (
    HEAD_SIZE,
    ID_AT,
    OFFSET_HEAD_SIZE,
    TRACED_OFFSET_HEAD,
    MessageLayout,
    RawMessage,
    decode_message,
)
from smartnsq.spark import youzan
from smartnsq.spark.columns import header_pairs, signed, timestamps
from smartnsq.spark.youzan import PartitionInfo

ROWS_PER_BATCH = 10_000
STALL_TIMEOUT = 60.0  # no message for this long while some are due: the task fails
_READ_SIZE = 1 << 20


@dataclass(frozen=True)
class Range:
    """The messages of ``info.partition`` with ``start <= offset < end``."""

    info: PartitionInfo
    start: int
    end: int


def read_ranges(
    ranges: Sequence[Range],
    config: ConnectionConfig,
    channel_prefix: str,
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    """Arrow batches (``schema``) of the messages of every range, the ranges read at once
    (one connection each): a partition's rows come in offset order, partitions interleave.

    Reading several partitions at once keeps a task busy while one leader is slow to send
    (the fork's disk queue; one message at a time on an ordered topic).
    """
    todo = [r for r in ranges if r.start < r.end]
    channels: list[tuple[PartitionInfo, str]] = []
    reads: list[_Read] = []

    def open_read(r: Range) -> _Read | None:
        channel = youzan.task_channel(channel_prefix)
        channels.append((r.info, channel))
        first = youzan.open_channel(r.info, channel, r.start)
        if first >= r.end:
            return None  # no message starts in the range: nothing to wait for
        read = _Read(r, channel, config, first)
        reads.append(read)
        return read

    try:
        opened = [read for read in map(open_read, todo) if read is not None]
        yield from _pump(opened, schema, open_read)
    finally:
        for read in reads:
            read.close()
        for info, channel in channels:
            youzan.delete_channel(info, channel)


REOPEN_TRIES = 5  # channels opened for one range whose first delivery was misplaced


class _Misplaced(Exception):
    """The first message a channel delivered is not at the offset it was moved to."""


def _pump(
    reads: list[_Read], schema: pa.Schema, reopen: Callable[[Range], _Read | None]
) -> Iterator[pa.RecordBatch]:
    active = list(reads)
    while active:
        ready, _, _ = select.select(active, [], [], 1.0)
        now = time.monotonic()
        for read in ready:
            try:
                yield from read.receive(schema, now)
            except _Misplaced as exc:
                # Nothing of the range was taken yet: read it again through a new channel.
                read.close()
                active.remove(read)
                if read.tries >= REOPEN_TRIES:
                    raise ProtocolError(
                        f"{exc}; {read.tries} channels in a row did that: the task fails "
                        "rather than skip messages"
                    ) from None
                again = reopen(read.range)
                if again is not None:
                    again.tries = read.tries + 1
                    active.append(again)
                continue
            if read.done:
                read.close()
                active.remove(read)
        for read in active:  # a read just taken has last_data == now: never stalled
            read.check_stall(now)


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


_LAYOUT = MessageLayout(binary_id=True, ext=True, offset=True)


class _Read:
    """One partition's range, read through a connection of its own (a plain read loop, no
    request queue): FINs what it reads, stops at ``end``."""

    def __init__(self, r: Range, channel: str, config: ConnectionConfig, first: int) -> None:
        info = r.info
        self.range, self.tries = r, 1
        self.info, self.end, self.expect = info, r.end, r.start
        # The offset the channel was moved to: its first delivery must be there. The fork's
        # channel reads ahead from where it was made, and delivers first what was published
        # between /channel/create and /channel/setoffset (/stats shows it moved all the
        # same): taken for the end of the range, that lost the whole range.
        self.first: int | None = first
        self.done = self.subscribed = False
        self.rows = _new_rows(info)
        # Here, not at the top: the driver imports this module too, and smartnsq.sync costs
        # 40 ms of a query's start there.
        from smartnsq.net.blocking import SyncConnection

        config = dataclasses.replace(config, extend_support=True if info.ext else None)
        own = SyncConnection.open(info.nsqd, config, config.connect_timeout).detach(STALL_TIMEOUT)
        self.sock, self.decoder, self.max_rdy = own.sock, own.decoder, own.features.max_rdy_count
        self.compress: Callable[[bytes], bytes] = own.compress or _same
        self.decompress: Callable[[bytes], bytes] = own.decompress or _same
        self.last_data = time.monotonic()
        try:
            # Four tokens: the fork ignores the partition of a SUB_ADVANCED that also has a
            # start. An ordered topic takes SUB_ORDERED only (E_SUB_ORDER_IS_MUST); its
            # deliveries carry their queue offsets too, one message at a time.
            sub = "SUB_ORDERED" if info.ordered else "SUB_ADVANCED"
            line = f"{sub} {info.topic} {channel} {info.partition}\n".encode()
            self.sock.sendall(self.compress(line))
        except BaseException:
            self.close()
            raise

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()

    def check_stall(self, now: float) -> None:
        if now - self.last_data > STALL_TIMEOUT:
            info = self.info
            raise NSQTimeout(
                f"partition {info.partition} of {info.topic!r} on nsqd {info.nsqd}: no message "
                f"for {STALL_TIMEOUT:.0f} s while reading offsets {self.expect} to {self.end}"
            )

    def receive(self, schema: pa.Schema, now: float) -> list[pa.RecordBatch]:
        """Take what the socket has; the batches that filled (and the last one when done)."""
        data = self.sock.recv(_READ_SIZE)
        if not data:
            raise ConnectionClosed(f"nsqd {self.info.nsqd} closed the connection mid-read")
        self.last_data = now
        buf, spans = self.decoder.feed_spans(self.decompress(data))
        info, rows, expect, end, done = self.info, self.rows, self.expect, self.end, self.done
        first = self.first
        # timestamp, attempts, internal id, trace id (signed), queue offset, raw size
        unpack = TRACED_OFFSET_HEAD.unpack_from
        batches: list[pa.RecordBatch] = []
        fins: list[bytes] = []  # the ids of what it read, all FINed
        out: list[bytes] = []  # the odd NOP or RDY
        for ftype, lo, hi in spans:
            if ftype == FRAME_MESSAGE:
                if done:
                    continue  # sent before nsqd saw us stop: the channel goes anyway
                message_id = buf[lo + ID_AT : lo + HEAD_SIZE]
                fins.append(message_id)
                if rows.headers is None:
                    stamp, tries, _, trace, offset, size = unpack(buf, lo)
                    body = buf[lo + OFFSET_HEAD_SIZE : hi]
                else:
                    msg = decode_message(buf[lo:hi], _LAYOUT, RawMessage)
                    stamp, tries, trace = msg.timestamp, msg.attempts, signed(msg.trace_id)
                    offset, size, body = msg.offset or 0, msg.raw_size or 1, msg.body
                if offset < expect:
                    continue  # a redelivery of what we already have
                if first is not None:
                    if offset != first:
                        raise _Misplaced(
                            f"partition {info.partition} of {info.topic!r} on nsqd {info.nsqd}: "
                            f"a channel moved to offset {first} delivered offset {offset} first"
                        )
                    first = None
                elif offset > expect:
                    # Each message starts where the one before ends: a gap is messages the
                    # channel skipped. Fail the task (Spark retries it) rather than lose them.
                    raise ProtocolError(
                        f"partition {info.partition} of {info.topic!r} on nsqd {info.nsqd}: "
                        f"offset {offset} delivered where {expect} was due (reading {end})"
                    )
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
                    batches.append(to_batch(rows, info, schema))
                    rows = _new_rows(info)
            elif ftype == FRAME_ERROR:
                raise error_from_frame(buf[lo:hi])
            else:
                payload = buf[lo:hi]
                if payload == HEARTBEAT:
                    out.append(commands.NOP)
                elif payload == OK and not self.subscribed:
                    self.subscribed = True
                    out.append(commands.rdy(self.max_rdy))
        if (fins or out) and not done:
            self.sock.sendall(self.compress(commands.fins(fins) + b"".join(out)))
        if done and len(rows):
            batches.append(to_batch(rows, info, schema))
            rows = _new_rows(info)
        self.rows, self.expect, self.done, self.first = rows, expect, done, first
        return batches


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
