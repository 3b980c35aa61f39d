"""Writing a DataFrame to NSQ: ``df.write.format("nsq")`` and ``df.writeStream.format("nsq")``.

Each Spark task publishes its rows from a pooled :class:`~smartnsq.Producer` and returns only
when nsqd has acknowledged every one of them. Delivery is at least once, as with Spark's Kafka
sink: a task that fails part-way, or a micro-batch that is run again, publishes its rows again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import anyio
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from smartnsq.errors import InvalidArgument, InvalidType
from smartnsq.notice import warn_unheard
from smartnsq.producer import Producer
from smartnsq.spark import loop
from smartnsq.spark.options import Settings

log = logging.getLogger("smartnsq.spark")

_INTS = (IntegerType, LongType, ShortType)
# column -> (accepted Spark types, how to describe them)
COLUMNS: dict[str, tuple[tuple[type[DataType], ...], str]] = {
    "value": ((BinaryType, StringType), "binary or string"),
    "topic": ((StringType,), "string"),
    "key": ((StringType, BinaryType, *_INTS), "string, binary or long"),
    "partition": (_INTS, "int"),
    "headers": ((MapType,), "map<string,string>"),
    "trace_id": (_INTS, "long"),
    "delay_ms": (_INTS, "long"),
}
_ROUTED = ("key", "partition", "headers", "trace_id", "delay_ms")
_IN_FLIGHT = 8  # MPUBs a task keeps waiting for at once


def check_columns(schema: StructType, settings: Settings) -> tuple[str, ...]:
    """The columns the writer uses; raises at planning time for anything it cannot publish."""
    used = []
    extra = []
    for f in schema.fields:
        accepted = COLUMNS.get(f.name)
        if accepted is None:
            extra.append(f.name)
            continue
        types_, described = accepted
        ok = isinstance(f.dataType, types_)
        if ok and isinstance(f.dataType, MapType):
            ok = isinstance(f.dataType.keyType, StringType) and isinstance(
                f.dataType.valueType, StringType
            )
        if not ok:
            raise InvalidType(
                f"column {f.name!r} must be {described}, not {f.dataType.simpleString()}: "
                f"cast it (e.g. col({f.name!r}).cast(...)) or rename it"
            )
        used.append(f.name)
    if "value" not in used:
        raise InvalidArgument(
            "the nsq sink needs a 'value' column (binary or string) with the message bodies"
        )
    if extra and not settings.ignore_extra_columns:
        raise InvalidArgument(
            f"unknown column(s) {', '.join(map(repr, extra))}: the nsq sink writes "
            f"{', '.join(COLUMNS)}; drop the others or set option ignoreExtraColumns=true"
        )
    if settings.topic is None and "topic" not in used:
        raise InvalidArgument("set option 'topic', or give the DataFrame a 'topic' column")
    if "key" in used and "partition" in used:
        raise InvalidArgument("give either a 'key' or a 'partition' column, not both")
    return tuple(used)


@dataclass
class Published(WriterCommitMessage):
    """What one write task did; returned to the driver's ``commit``."""

    partition_id: int
    retries: int  # times Spark ran this task before (their rows may have been published too)
    rows: int
    bytes: int
    seconds: float


def _pool_key(settings: Settings) -> tuple[Any, ...]:
    return (settings.nsqd, settings.lookupd, settings.client)


class _Writer:
    """The publishing shared by the batch and streaming writers."""

    def __init__(self, settings: Settings, columns: tuple[str, ...]) -> None:
        self.settings = settings
        self.columns = columns

    def publish(self, batches: Iterator[pa.RecordBatch]) -> Published:
        ctx = TaskContext.get()
        started = time.monotonic()
        key = _pool_key(self.settings)
        producer = loop.producer(key, self.settings.client_kwargs())
        plain = not any(c in self.columns for c in _ROUTED)
        rows = size = acked = 0
        pending: list[tuple[Future[None], int]] = []  # a batch being published, its rows
        portal = loop.loop().portal
        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                groups = self._groups(batch, plain)
                rows += batch.num_rows
                size += sum(g.size for g in groups)
                # Plain rows carry no order; the next batch is converted while this one is
                # published. Keyed rows wait, so that one key's messages stay in order.
                while pending and (len(pending) >= 2 or not plain):
                    acked += _wait(pending.pop(0))
                future = portal.start_task_soon(
                    _publish, producer, groups, plain, self.settings.batch_size
                )
                pending.append((future, batch.num_rows))
            while pending:
                acked += _wait(pending.pop(0))
        except Exception as exc:
            loop.discard(key)  # start the next task with fresh connections
            # The driver hears nothing else from a failed task: its error says what it left
            # in nsqd.
            exc.add_note(
                f"nsq sink: nsqd acknowledged at least {acked} rows of this task before it "
                "failed; they stay published (a retry publishes them again)"
            )
            raise
        finally:
            for fut, _ in pending:
                fut.cancel()
        return Published(
            partition_id=ctx.partitionId() if ctx else 0,
            retries=ctx.attemptNumber() if ctx else 0,
            rows=rows,
            bytes=size,
            seconds=round(time.monotonic() - started, 3),
        )

    def _groups(self, batch: pa.RecordBatch, plain: bool) -> list[_Group]:
        names = batch.schema.names
        value = batch.column(names.index("value"))
        if value.null_count:
            raise InvalidArgument("a row has a null 'value': NSQ messages need a body")
        if pa.types.is_string(value.type) or pa.types.is_large_string(value.type):
            value = value.cast(pa.binary())
        bodies: list[bytes] = value.to_pylist()
        topic_opt = self.settings.topic
        topics: list[str | None] | None = None
        if topic_opt is None:
            topics = batch.column(names.index("topic")).to_pylist()
        if plain:
            if topics is None:
                assert topic_opt is not None
                return [_Group(topic_opt, None, bodies, None)]
            by_topic: dict[str, list[bytes]] = {}
            for t, body in zip(topics, bodies, strict=True):
                by_topic.setdefault(_topic(t), []).append(body)
            return [_Group(t, None, b, None) for t, b in by_topic.items()]
        cols = {c: batch.column(names.index(c)).to_pylist() for c in _ROUTED if c in names}
        n = batch.num_rows
        none = [None] * n
        keys = cols.get("key", none)
        parts = cols.get("partition", none)
        headers = cols.get("headers", none)
        traces = cols.get("trace_id", none)
        delays = cols.get("delay_ms", none)
        groups: dict[tuple[str, Any, Any], _Group] = {}
        for i in range(n):
            t = topic_opt if topic_opt is not None else _topic(topics[i] if topics else None)
            k, p = keys[i], parts[i]
            g = groups.get((t, k, p))
            if g is None:
                g = groups[(t, k, p)] = _Group(t, (k, p), [], [])
            assert g.extras is not None
            h = headers[i]
            g.bodies.append(bodies[i])
            g.extras.append((None if h is None else dict(h), traces[i], delays[i]))
        return list(groups.values())

    def commit(self, messages: Sequence[WriterCommitMessage | None], what: str) -> None:
        done = [m for m in messages if isinstance(m, Published)]
        rows = sum(m.rows for m in done)
        size = sum(m.bytes for m in done)
        retried = [m.partition_id for m in done if m.retries > 0]
        log.info(
            "nsq sink: %s published %d messages (%d bytes) to %s in %d tasks",
            what,
            rows,
            size,
            self.settings.topic or "the topics of the 'topic' column",
            len(done),
        )
        if retried:
            text = (
                f"nsq sink: {what}: tasks of partitions {retried} were run again; their rows "
                "may have been published more than once (delivery is at least once)"
            )
            log.warning("%s", text)
            warn_unheard(log, "spark-retried", text)

    def abort(self, messages: Sequence[WriterCommitMessage | None], what: str) -> None:
        done = [m for m in messages if isinstance(m, Published)]
        text = (
            f"nsq sink: {what} failed; {sum(m.rows for m in done)} messages of {len(done)} "
            "finished tasks were already published, and the failed tasks may have published "
            "some of their rows too: the driver cannot count those, each failed task's error "
            "says how many nsqd acknowledged (NSQ cannot take them back)"
        )
        log.warning("%s", text)
        warn_unheard(log, "spark-abort", text)


def _wait(item: tuple[Future[None], int]) -> int:
    """Wait for a batch's publish; its row count once nsqd acknowledged them all."""
    future, rows = item
    future.result()
    return rows


def _topic(value: str | None) -> str:
    if value is None:
        raise InvalidArgument("a row has a null 'topic' and no 'topic' option is set")
    return value


@dataclass
class _Group:
    """Rows for one topic and one route (sharding key or partition), in row order."""

    topic: str
    route: tuple[Any, Any] | None  # (key, partition)
    bodies: list[bytes]
    # per row (headers, trace_id, delay_ms); None when the batch has none of them
    extras: list[tuple[dict[str, str] | None, int | None, int | None]] | None

    @property
    def size(self) -> int:
        return sum(map(len, self.bodies))


async def _publish(producer: Producer, groups: list[_Group], plain: bool, chunk: int) -> None:
    """Publish every group; groups (and, for plain rows, MPUB chunks) go out concurrently."""
    limiter = anyio.CapacityLimiter(_IN_FLIGHT)

    async def mpub(topic: str, bodies: list[bytes]) -> None:
        async with limiter:
            await producer.publish_many(topic, bodies)

    async def in_order(group: _Group) -> None:
        async with limiter:
            await _publish_group(producer, group, chunk)

    try:
        async with anyio.create_task_group() as tg:
            for g in groups:
                if plain:
                    for i in range(0, len(g.bodies), chunk):
                        tg.start_soon(mpub, g.topic, g.bodies[i : i + chunk])
                else:
                    tg.start_soon(in_order, g)
    except ExceptionGroup as group:
        # Spark shows the task's error to the user: the first cause, not a group of them.
        raise _first(group) from None


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    exc = group.exceptions[0]
    return _first(exc) if isinstance(exc, BaseExceptionGroup) else exc


async def _publish_group(producer: Producer, g: _Group, chunk: int) -> None:
    """One route's rows in order: runs of rows with nothing but a trace id go as MPUB."""
    assert g.route is not None and g.extras is not None
    key, partition = g.route
    i, n = 0, len(g.bodies)
    while i < n:
        headers, trace, delay = g.extras[i]
        if headers is not None or delay is not None:
            await producer.publish(
                g.topic,
                g.bodies[i],
                delay=None if delay is None else delay / 1000,
                partition=partition,
                sharding_key=key,
                trace_id=trace,
                headers=headers,
            )
            i += 1
            continue
        traced = trace is not None
        j = i + 1
        while (
            j < n
            and j - i < chunk
            and g.extras[j][0] is None
            and g.extras[j][2] is None
            and (g.extras[j][1] is not None) == traced
        ):
            j += 1
        trace_ids = [int(e[1]) for e in g.extras[i:j] if e[1] is not None] if traced else None
        await producer.publish_many(
            g.topic, g.bodies[i:j], partition=partition, sharding_key=key, trace_ids=trace_ids
        )
        i = j


class NsqWriter(DataSourceArrowWriter):
    """Batch writer: ``df.write.format("nsq").mode("append").save()``."""

    def __init__(self, settings: Settings, columns: tuple[str, ...]) -> None:
        self._w = _Writer(settings, columns)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self._w.publish(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._w.commit(messages, "write")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._w.abort(messages, "write")


class NsqStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writer: ``df.writeStream.format("nsq").start()``."""

    def __init__(self, settings: Settings, columns: tuple[str, ...]) -> None:
        self._w = _Writer(settings, columns)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self._w.publish(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._w.commit(messages, f"micro-batch {batchId}")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._w.abort(messages, f"micro-batch {batchId}")
