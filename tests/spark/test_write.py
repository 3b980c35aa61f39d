"""df.write / df.writeStream to real nsqd through the nsq data source."""

from __future__ import annotations

import re
from typing import Any

import anyio
import pytest

from tests.helpers import drain, topic_stats, unique, wait_for

pytestmark = pytest.mark.integration


def test_batch_write_publishes_every_row_once(spark: Any, classic_cluster: Any) -> None:
    nsqd = classic_cluster.nsqd[0]
    topic = unique("spark_w")
    n = 100_000
    df = spark.range(n, numPartitions=4).selectExpr("CAST(concat('m-', id) AS BINARY) AS value")
    df.write.format("nsq").mode("append").option("nsqd", nsqd.tcp).option("topic", topic).save()

    stats = topic_stats(nsqd.http, topic)
    assert stats is not None and stats["message_count"] == n
    got = anyio.run(drain, nsqd.tcp, topic, "check", n)
    bodies = sorted(m.body for m in got)
    assert bodies == sorted(b"m-%d" % i for i in range(n))


def test_key_column_routes_like_the_producer(spark: Any, youzan_cluster: Any) -> None:
    from compat.youzan import create_topic
    from smartnsq import Consumer, Message
    from smartnsq.ordered import go_partition
    from tests.helpers import lookupds

    topic = unique("spark_k")
    create_topic(youzan_cluster, topic, partitions=2, replicas=1, channel="ch")
    n, keys = 400, 16
    df = spark.range(n, numPartitions=2).selectExpr(
        "concat('k', id % 16) AS key", "concat('k', id % 16, ':', id) AS value"
    )
    (
        df.repartition("key")  # one task per key keeps each key's order
        .write.format("nsq")
        .mode("append")
        .option("lookupd", ",".join(lookupds(youzan_cluster)))
        .option("topic", topic)
        .save()
    )

    got: dict[bytes, int] = {}

    async def consume() -> None:
        done = anyio.Event()

        def handle(message: Message) -> None:
            got[message.body] = message.partition  # type: ignore[assignment]
            if len(got) >= n:
                done.set()

        async with Consumer(
            topic, "ch", handle, lookupd_http_addresses=lookupds(youzan_cluster), max_in_flight=64
        ):
            with anyio.fail_after(60):
                await done.wait()

    anyio.run(consume)
    assert len(got) == n
    used = set()
    for body, partition in got.items():
        key = body.split(b":")[0].decode()
        assert partition == go_partition(key, 2), body
        used.add(partition)
    assert used == {0, 1}, "16 keys over 2 partitions should use both"
    assert len({b.split(b":")[0] for b in got}) == keys


def test_stream_write_from_rate_source(spark: Any, classic_cluster: Any, tmp_path: Any) -> None:
    nsqd = classic_cluster.nsqd[0]
    topic = unique("spark_ws")
    df = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 200)
        .load()
        .selectExpr("CAST(value AS STRING) AS value", "timestamp")
    )
    query = (
        df.writeStream.format("nsq")
        .option("nsqd", nsqd.tcp)
        .option("topic", topic)
        .option("ignoreExtraColumns", "true")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        # At most 90 batches in the wait below: Spark's progress keeps the last 100.
        .trigger(processingTime="1 second")
        .start()
    )
    # The rate source numbers its rows 0, 1, 2, ... in micro-batch order. The stop may cut
    # the micro-batch it interrupts (at least once: the rows of its finished tasks stay
    # published), so the check is on the batches finished before it.
    try:
        finished = wait_for(
            lambda: (n := sum(p["numInputRows"] for p in query.recentProgress)) >= 300 and n,
            timeout=90,
            what="300 rows through finished micro-batches of the streaming sink",
        )
    finally:
        query.stop()
    assert query.exception() is None
    count = topic_stats(nsqd.http, topic)["message_count"]  # type: ignore[index]
    got = anyio.run(drain, nsqd.tcp, topic, "check", count)
    values = sorted(int(m.body) for m in got)
    # Every finished micro-batch went out whole, once: those values with no gap or repeat.
    assert values[:finished] == list(range(finished))
    assert len(set(values)) == len(values)


def test_unreachable_nsqd_fails_the_write_with_the_cause(spark: Any) -> None:
    from compat.cluster import free_port

    df = spark.range(10).selectExpr("CAST(id AS STRING) AS value")
    writer = df.write.format("nsq").mode("append").option("topic", "nowhere")
    with pytest.raises(Exception) as info:
        writer.option("nsqd", f"127.0.0.1:{free_port()}").option("nsq.max_retries", 0).save()
    text = str(info.value)
    # The task's own error, not a task-group wrapper around it.
    assert "NoNsqdAvailable: no nsqd reachable" in text
    assert "ExceptionGroup" not in text


def test_headers_and_trace_ids_round_trip_on_a_youzan_ext_topic(
    spark: Any, youzan_cluster: Any
) -> None:
    from compat.youzan import create_topic
    from tests.helpers import lookupds

    topic = unique("spark_x")
    create_topic(youzan_cluster, topic, partitions=1, replicas=1, ext=True, channel="ch")
    lookupd = ",".join(lookupds(youzan_cluster))
    n = 20
    df = spark.range(n).selectExpr(
        "CAST(id AS STRING) AS value",
        "IF(id % 2 = 0, map('k', CAST(id AS STRING)), NULL) AS headers",
        "id + 1000 AS trace_id",
    )
    df.write.format("nsq").mode("append").option("lookupd", lookupd).option("topic", topic).save()

    rows = (
        spark.read.format("nsq")
        .option("lookupd", lookupd)
        .option("topic", topic)
        .option("channel", "ch")
        .option("maxMessages", n)
        .load()
        .collect()
    )
    assert len(rows) == n
    for row in rows:
        i = int(row.value)
        assert row.partition == 0 and row.trace_id == i + 1000 and len(row.id) == 32
        assert {k: v for k, v in row.headers.items() if not k.startswith("##")} == (
            {"k": str(i)} if i % 2 == 0 else {}
        )


def test_a_failed_write_says_how_many_rows_nsqd_already_has(
    spark: Any, classic_cluster: Any
) -> None:
    nsqd = classic_cluster.nsqd[0]
    topic = unique("spark_fail")
    n = 50_000  # several Arrow batches in one task; the last row cannot be published
    df = spark.range(n, numPartitions=1).selectExpr(
        f"CASE WHEN id = {n - 1} THEN NULL ELSE CAST(id AS STRING) END AS value"
    )
    writer = df.write.format("nsq").mode("append").option("nsqd", nsqd.tcp)
    with pytest.raises(Exception) as info:
        writer.option("topic", topic).save()
    text = str(info.value)
    assert "null 'value'" in text
    m = re.search(r"nsqd acknowledged at least (\d+) rows of this task", text)
    assert m, text[-2000:]
    acked = int(m.group(1))
    stats = topic_stats(nsqd.http, topic)
    assert stats is not None and 0 < acked <= stats["message_count"] < n


def test_the_abort_warning_says_failed_tasks_may_have_published(caplog: Any) -> None:
    from smartnsq import Producer
    from smartnsq.spark.options import parse
    from smartnsq.spark.sink import NsqWriter, Published

    settings = parse({"nsqd": "127.0.0.1:4150", "topic": "t"}, reading=False, client=Producer)
    writer = NsqWriter(settings, ("value",))
    with caplog.at_level("WARNING", logger="smartnsq.spark"):
        writer.abort([Published(0, 0, 10, 100, 0.1), None])
    (record,) = caplog.records
    assert "10 messages of 1 finished tasks" in record.message
    assert "failed tasks may have published" in record.message
