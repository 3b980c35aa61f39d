"""spark.readStream / spark.read from a real classic nsqd through the nsq data source."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from smartnsq import Producer
from tests.helpers import channel_stats, create_channel, unique, wait_for

pytestmark = pytest.mark.integration


def publish(nsqd_tcp: str, topic: str, bodies: list[bytes]) -> None:
    async def go() -> None:
        async with Producer([nsqd_tcp]) as producer:
            for i in range(0, len(bodies), 500):
                await producer.publish_many(topic, bodies[i : i + 500])

    anyio.run(go)


def test_stream_read_stopped_midway_loses_nothing(
    spark: Any, classic_cluster: Any, tmp_path: Any
) -> None:
    nsqd = classic_cluster.nsqd[0]
    topic, channel = unique("spark_r"), "spark"
    create_channel(nsqd.http, topic, channel)
    n = 3000
    expected = {b"r-%d" % i for i in range(n)}
    publish(nsqd.tcp, topic, sorted(expected))
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")

    def start(**trigger: Any) -> Any:
        return (
            spark.readStream.format("nsq")
            .option("nsqd", nsqd.tcp)
            .option("topic", topic)
            .option("channel", channel)
            .option("maxMessagesPerTrigger", 250)
            # nsqd hands the messages of a stopped query to others only after their
            # timeout; a short one keeps the test short.
            .option("nsq.msg_timeout", 3)
            .option("idleTimeoutMs", 8000)
            .load()
            .writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", ckpt)
            .trigger(**trigger)
            .start()
        )

    query = start(processingTime="200 milliseconds")
    try:
        wait_for(
            lambda: query.lastProgress and query.lastProgress["batchId"] >= 2,
            timeout=120,
            what="three micro-batches",
        )
    finally:
        query.stop()
    first = spark.read.parquet(out).count()
    assert 0 < first < n, "the query should stop part-way"

    # The rest of the run: messages of unfinished batches come back from nsqd.
    query = start(availableNow=True)
    assert query.awaitTermination(180)
    assert query.exception() is None
    rows = spark.read.parquet(out).select("value", "topic", "attempts", "id", "nsqd").collect()
    assert {bytes(r.value) for r in rows} == expected
    assert {r.topic for r in rows} == {topic}
    assert {r.nsqd for r in rows} == {nsqd.tcp}
    assert all(len(r.id) == 16 and r.attempts >= 1 for r in rows)
    # The last batch was FINed without a later batch or commit: nothing left in flight.
    stats = wait_for(
        lambda: (
            (s := channel_stats(nsqd.http, topic, channel))
            and s["depth"] == 0
            and s["in_flight_count"] == 0
            and s
        ),
        timeout=30,
        what="an empty channel",
    )
    assert stats["message_count"] >= n


def test_batch_read_consumes_up_to_max_messages(spark: Any, classic_cluster: Any) -> None:
    nsqd = classic_cluster.nsqd[0]
    topic, channel = unique("spark_b"), "batch"
    create_channel(nsqd.http, topic, channel)
    publish(nsqd.tcp, topic, [b"b-%d" % i for i in range(50)])

    def load(**options: Any) -> Any:
        reader = spark.read.format("nsq").option("nsqd", nsqd.tcp).option("topic", topic)
        reader = reader.option("channel", channel).option("idleTimeoutMs", 3000)
        for k, v in options.items():
            reader = reader.option(k, v)
        return reader.load()

    first = load(maxMessages=30).collect()
    assert len(first) == 30
    row = first[0]
    assert row.topic == topic and row.partition is None and row.offset is None
    assert row.trace_id is None and row.headers is None and row.attempts == 1
    assert row.nsqd == nsqd.tcp and row.timestamp is not None
    rest = load().select("value").collect()
    assert sorted(bytes(r.value) for r in first + rest) == sorted(b"b-%d" % i for i in range(50))
    stats = channel_stats(nsqd.http, topic, channel)
    assert stats is not None and stats["depth"] == 0 and stats["in_flight_count"] == 0


def test_each_action_on_a_batch_read_consumes_again_unless_cached(
    spark: Any, classic_cluster: Any
) -> None:
    # What docs/spark.md says about batch reads, checked.
    nsqd = classic_cluster.nsqd[0]
    topic, channel = unique("spark_a"), "actions"
    create_channel(nsqd.http, topic, channel)
    publish(nsqd.tcp, topic, [b"a-%d" % i for i in range(40)])

    def load() -> Any:
        reader = spark.read.format("nsq").option("nsqd", nsqd.tcp).option("topic", topic)
        return reader.option("channel", channel).option("maxMessages", 10).load()

    df = load()
    first = {bytes(r.value) for r in df.collect()}
    second = {bytes(r.value) for r in df.collect()}
    assert len(first) == len(second) == 10 and not first & second  # read twice
    cached = load().cache()
    kept = {bytes(r.value) for r in cached.collect()}
    assert cached.count() == 10  # from the cache: nothing consumed
    assert {bytes(r.value) for r in cached.collect()} == kept
    stats = channel_stats(nsqd.http, topic, channel)
    assert stats is not None and stats["depth"] == 10  # 40 - 3 reads of 10
    cached.unpersist()
