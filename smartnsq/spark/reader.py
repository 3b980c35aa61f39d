"""Reading NSQ from Spark: ``spark.readStream.format("nsq")`` and ``spark.read.format("nsq")``.

Classic nsqd keeps no offsets and cannot replay, and a message must be answered on the
connection that received it. So the streaming source consumes on the driver, in the process
Spark keeps for the query, and FINs a message only once Spark has committed the micro-batch
that held it: at least once, never lost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    InputPartition,
    SimpleDataSourceStreamReader,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from smartnsq.consumer.message import Message
from smartnsq.errors import NoNsqdAvailable
from smartnsq.protocol.message import span_bodies, span_heads
from smartnsq.spark.columns import header_pairs, signed, timestamps
from smartnsq.spark.feed import Feed, Raw, Taken, raw_ids
from smartnsq.spark.options import Settings

_ROWS_PER_BATCH = 10_000


def to_batch(messages: list[Message], topic: str, schema: StructType) -> pa.RecordBatch:
    """Rows for ``messages`` as one Arrow batch in exactly the layout Spark expects."""
    # A Youzan message says its partition; a classic one has none (and a hex-text id).
    youzan = [m.partition is not None for m in messages]
    n = len(messages)
    columns: dict[str, Callable[[pa.DataType], pa.Array]] = {
        "value": lambda t: pa.array([m.body for m in messages], type=t),
        "topic": lambda t: pa.repeat(pa.scalar(topic, type=t), n),
        "partition": lambda t: pa.array([m.partition for m in messages], type=t),
        "offset": lambda t: pa.array([m.offset for m in messages], type=t),
        "timestamp": lambda t: timestamps([m.timestamp for m in messages], t),
        "attempts": lambda t: pa.array([m.attempts for m in messages], type=t),
        "id": lambda t: pa.array(
            [
                m.id.hex() if y else m.id.decode("ascii", "replace")
                for m, y in zip(messages, youzan, strict=True)
            ],
            type=t,
        ),
        "trace_id": lambda t: pa.array(
            [signed(m.trace_id) if y else None for m, y in zip(messages, youzan, strict=True)],
            type=t,
        ),
        "headers": lambda t: pa.array(
            [header_pairs(m) if y else None for m, y in zip(messages, youzan, strict=True)], type=t
        ),
        "nsqd": lambda t: pa.array([m.nsqd_address for m in messages], type=t),
    }
    pa_schema = to_arrow_schema(schema, timezone="UTC")
    arrays = [columns[f.name](f.type) for f in pa_schema]
    return pa.RecordBatch.from_arrays(arrays, schema=pa_schema)


def raw_batch(raw: list[Raw], topic: str, schema: StructType) -> pa.RecordBatch:
    """Rows for classic reads (see :class:`~smartnsq.spark.feed.Taken`), cut straight from
    the read buffers; the same layout as :func:`to_batch`."""
    bodies: list[bytes] = []
    ids: list[bytes] = []
    heads: list[tuple[int, int]] = []
    nsqd: list[str] = []
    for reader, src, spans in raw:
        bodies += span_bodies(src, spans)
        ids += raw_ids(src, spans)
        heads += span_heads(src, spans)
        nsqd += [reader.address] * len(spans)
    n = len(bodies)
    stamps, attempts = zip(*heads, strict=True) if heads else ((), ())
    given: dict[str, Callable[[pa.DataType], pa.Array]] = {
        "value": lambda t: pa.array(bodies, type=t),
        "topic": lambda t: pa.repeat(pa.scalar(topic, type=t), n),
        "timestamp": lambda t: timestamps(stamps, t),
        "attempts": lambda t: pa.array(attempts, type=t),
        "id": lambda t: _text_ids(ids, t),
        "nsqd": lambda t: pa.array(nsqd, type=t),
    }
    pa_schema = to_arrow_schema(schema, timezone="UTC")
    # No partition, offset, trace id or headers on classic nsqd: nulls.
    arrays = [given[f.name](f.type) if f.name in given else pa.nulls(n, f.type) for f in pa_schema]
    return pa.RecordBatch.from_arrays(arrays, schema=pa_schema)


def _text_ids(ids: list[bytes], t: pa.DataType) -> pa.Array:
    # nsqd's ids are hex text already: checked as UTF-8 by Arrow, not decoded one by one
    try:
        return pa.array(ids, type=pa.binary()).cast(t)
    except pa.ArrowInvalid:
        return pa.array([i.decode("ascii", "replace") for i in ids], type=t)


def to_batches(taken: Taken, topic: str, schema: StructType) -> list[pa.RecordBatch]:
    """Rows for everything ``taken``, in batches of at most ``_ROWS_PER_BATCH``."""
    out: list[pa.RecordBatch] = []
    if taken.raw:
        whole = raw_batch(taken.raw, topic, schema)
        out += [whole.slice(i, _ROWS_PER_BATCH) for i in range(0, len(whole), _ROWS_PER_BATCH)]
    messages = taken.messages
    out += [
        to_batch(messages[i : i + _ROWS_PER_BATCH], topic, schema)
        for i in range(0, len(messages), _ROWS_PER_BATCH)
    ]
    return out


class NsqStreamReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streaming source for classic nsqd: consumes on the driver, at least once.

    Offsets are ``{"seq": n}``: n counts the messages this query has taken. A message is
    FINed when Spark has finished the micro-batch holding it (when it asks for the batch after
    it, or commits it, whichever comes first). Messages of a batch that was not finished are
    never FINed: when the query stops or dies, nsqd delivers them again.
    """

    def __init__(self, settings: Settings, schema: StructType) -> None:
        self.settings = settings
        self.schema = schema
        self._feed: Feed | None = None
        self._held: list[tuple[int, Taken]] = []  # (end seq, messages), oldest first
        self._available_now = False
        self._reached = False

    def __getstate__(self) -> dict[str, Any]:
        # Spark ships a copy of the reader to its tasks: without the live consumer.
        return {**self.__dict__, "_feed": None, "_held": []}

    def _started(self) -> Feed:
        if self._feed is None:
            # One batch held by Spark and the next one received meanwhile, so a read finds
            # its messages waiting (with room for one batch, it waited for them to arrive).
            per = self.settings.max_per_trigger
            self._feed = Feed(self.settings, 2 * per + min(per, 2500))
        return self._feed

    def initialOffset(self) -> dict[str, int]:
        return {"seq": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True

    def read(self, start: dict[str, int]) -> tuple[Iterator[pa.RecordBatch], dict[str, int]]:
        feed = self._started()
        seq = int(start["seq"])
        # Spark asks for the batch after `start` only once the batch ending at `start` is
        # done (its commit log is written), so everything below `start` can go. Waiting for
        # commit() would keep the last batch of an availableNow run in flight until the
        # process dies, and commit() comes only when a further batch is planned.
        self._settle(seq)
        settings = self.settings
        first_wait = settings.idle_timeout if self._available_now else settings.poll_timeout
        taken = feed.take(settings.max_per_trigger, first_wait, settings.poll_timeout)
        if not taken:
            if self._available_now and not self._reached:
                check_reached(feed, settings)  # "drained" must not mean "never connected"
                self._reached = True
            return iter(()), start
        end = seq + len(taken)
        self._held.append((end, taken))
        assert settings.topic is not None
        return iter(to_batches(taken, settings.topic, self.schema)), {"seq": end}

    def readBetweenOffsets(
        self, start: dict[str, int], end: dict[str, int]
    ) -> Iterator[pa.RecordBatch]:
        # A batch planned by an earlier run of the query that did not finish. NSQ cannot
        # replay it, and it need not: its messages were never FINed, so nsqd delivers them
        # again as new messages.
        return iter(())

    def commit(self, end: dict[str, int]) -> None:
        self._settle(int(end["seq"]))

    def _settle(self, seq: int) -> None:
        done = [msgs for end, msgs in self._held if end <= seq]
        if done and self._feed is not None:
            self._held = [(end, msgs) for end, msgs in self._held if end > seq]
            self._feed.finish(done)

    def stop(self) -> None:
        if self._feed is not None:
            self._feed.close()
            self._feed = None


def check_reached(feed: Feed, settings: Settings) -> None:
    """A read that got nothing fails if it could not connect to any nsqd it was given,
    instead of returning no rows as if the channel were empty (this runs where the read
    runs: an executor may not reach what the driver reached while planning)."""
    if settings.nsqd and not feed.connected():
        raise NoNsqdAvailable(
            f"no connection to any nsqd of option 'nsqd' ({', '.join(settings.nsqd)}) after "
            f"{settings.idle_timeout:g} s without a message: check the addresses (nsqd's TCP "
            "port, 4150 by default) and that this Spark process can reach them"
        )


@dataclass
class DrainPartition(InputPartition):
    """One task of a batch read: consume up to ``limit`` messages."""

    limit: int


class NsqBatchReader(DataSourceReader):
    """``spark.read.format("nsq")``: consumes (and FINs) up to maxMessages, like nsq_to_file."""

    def __init__(self, settings: Settings, schema: StructType) -> None:
        self.settings = settings
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        return [DrainPartition(self.settings.max_messages)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, DrainPartition)
        settings = self.settings
        assert settings.topic is not None
        feed = Feed(settings, min(partition.limit, 2500))
        try:
            left = partition.limit
            while left > 0:
                taken = feed.take(
                    min(left, _ROWS_PER_BATCH), settings.idle_timeout, settings.idle_timeout
                )
                if not taken:
                    if left == partition.limit:  # nothing at all: is anything there?
                        check_reached(feed, settings)
                    break
                left -= len(taken)
                yield from to_batches(taken, settings.topic, self.schema)
                if left <= 0:
                    feed.pause()  # before the FINs, which would open the RDY window again
                # Spark has taken the rows: the messages are consumed.
                feed.finish([taken])
        finally:
            feed.close()
