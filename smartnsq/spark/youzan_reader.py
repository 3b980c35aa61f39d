"""Reading a Youzan partitioned topic by queue offsets: replayable, like Spark's Kafka source.

Offsets are ``{"<topic>": {"<partition>": <queue offset>}}`` and live only in Spark's
checkpoint; nothing is committed to nsqd. Each task reads the ranges ``[start, end)`` of up
to ``partitionsPerTask`` partitions at once, each from its leader through a channel of its
own (:mod:`smartnsq.spark.range_read`), so a re-run micro-batch reads the same rows again and
no other consumer of the topic is disturbed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from smartnsq.protocol.handshake import ConnectionConfig
from smartnsq.spark import offsets_plan as plan
from smartnsq.spark import youzan
from smartnsq.spark.options import Settings
from smartnsq.spark.range_read import Range, read_ranges
from smartnsq.spark.youzan import PartitionInfo

OffsetDict = dict[str, dict[str, int]]
_TIDY_INTERVAL = 300.0  # seconds between looks for channels left by failed tasks


@dataclass
class RangePartition(InputPartition):
    """One task: the messages of a few partitions' offset ranges, read at once."""

    ranges: tuple[Range, ...]


def connection_config(settings: Settings) -> ConnectionConfig:
    """The connection settings (TLS, auth, timeouts...) the ``nsq.*`` options give a Consumer."""
    from smartnsq.consumer import Consumer  # here: only tasks need it, not the driver

    assert settings.topic is not None
    consumer = Consumer(settings.topic, settings.channel_prefix, **settings.client_kwargs())
    return dataclasses.replace(consumer.connection_config)


def _infos(settings: Settings) -> list[PartitionInfo]:
    assert settings.topic is not None
    return youzan.partitions(settings.lookupd, settings.topic)


class _RangeReads:
    settings: Settings
    schema: StructType

    def _tidy(self, infos: list[PartitionInfo]) -> None:
        # At most every few minutes: it reads every leader's /stats.
        now = time.monotonic()
        if now - getattr(self, "_tidied", -_TIDY_INTERVAL) >= _TIDY_INTERVAL:
            self._tidied = now
            youzan.remove_orphans(infos, self.settings.channel_prefix)

    def _ranges(
        self, start: plan.Offsets, end: plan.Offsets, infos: Sequence[PartitionInfo]
    ) -> list[InputPartition]:
        known = {i.partition: i for i in infos}
        start = plan.check_retained(start, infos, self.settings.fail_on_data_loss)
        ranges = [
            Range(known[p], start[p], e)
            for p, e in sorted(end.items())
            if p in known and e > start.get(p, e)
        ]
        return [RangePartition(g) for g in plan.group(ranges, self.settings.partitions_per_task)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            # partitions() found nothing to read (every range empty): Spark then runs one
            # task on a placeholder partition anyway.
            return
        yield from read_ranges(
            partition.ranges,
            connection_config(self.settings),
            self.settings.channel_prefix,
            to_arrow_schema(self.schema, timezone="UTC"),
        )


class YouzanBatchReader(_RangeReads, DataSourceReader):
    """``spark.read``: the rows between ``startingOffsets`` (default earliest) and
    ``endingOffsets`` (default latest), resolved when the query is planned."""

    def __init__(self, settings: Settings, schema: StructType) -> None:
        self.settings = settings
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        infos = _infos(self.settings)
        self._tidy(infos)
        start = plan.resolve_start(self.settings, infos, "earliest")
        end = plan.resolve_end(self.settings, infos)
        return self._ranges(start, end, infos)


class YouzanStreamReader(_RangeReads, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream``: micro-batches of offset ranges, replayed exactly after a restart.

    ``maxOffsetsPerTrigger`` caps the messages of a micro-batch (see
    :func:`~smartnsq.spark.offsets_plan.spread`); ``availableNow`` reads up to the ends seen
    when the query started. Partitions that appear later start at their earliest offset.
    """

    def __init__(self, settings: Settings, schema: StructType) -> None:
        self.settings = settings
        self.schema = schema
        self._target: plan.Offsets | None = None  # availableNow: stop here

    @property
    def _topic(self) -> str:
        assert self.settings.topic is not None
        return self.settings.topic

    def initialOffset(self) -> OffsetDict:
        # Only for a new query: a restarted one resumes from its checkpoint.
        infos = _infos(self.settings)
        start = plan.resolve_start(self.settings, infos, "latest")
        return plan.to_spark(
            self._topic, plan.check_retained(start, infos, self.settings.fail_on_data_loss)
        )

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.settings.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {i.partition: i.end for i in _infos(self.settings)}

    def latestOffset(self, start: OffsetDict, limit: ReadLimit) -> OffsetDict:
        infos = _infos(self.settings)
        self._tidy(infos)
        begin = {i.partition: i.earliest for i in infos}
        begin.update(plan.from_spark(self._topic, start))
        begin = plan.check_retained(begin, infos, self.settings.fail_on_data_loss)
        end = {i.partition: max(begin[i.partition], i.end) for i in infos}
        if self._target is not None:
            end = {p: max(begin[p], min(e, self._target.get(p, begin[p]))) for p, e in end.items()}
        if isinstance(limit, ReadMaxRows):
            end = plan.spread(limit.max_rows, begin, end, infos)
        return plan.to_spark(self._topic, end)

    def partitions(self, start: OffsetDict, end: OffsetDict) -> list[InputPartition]:
        infos = _infos(self.settings)
        first = {i.partition: i.earliest for i in infos}
        first.update(plan.from_spark(self._topic, start))
        return self._ranges(first, plan.from_spark(self._topic, end), infos)

    def commit(self, end: OffsetDict) -> None:
        # Progress is Spark's checkpoint alone: nothing to tell nsqd.
        pass
