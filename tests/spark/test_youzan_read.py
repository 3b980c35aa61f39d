"""spark.readStream / spark.read of a Youzan partitioned topic by offsets (real cluster)."""

from __future__ import annotations

import json
import time
from typing import Any

import anyio
import pytest

from compat.youzan import create_topic
from smartnsq import Producer
from tests.helpers import http_json, lookupds, unique, wait_for

pytestmark = pytest.mark.integration

PARTITIONS = 3


def new_topic(cluster: Any, prefix: str) -> tuple[str, dict[int, str]]:
    """A topic with PARTITIONS partitions (and channel "ch"); the HTTP address of each leader."""
    topic = unique(prefix)
    info = create_topic(cluster, topic, partitions=PARTITIONS, channel="ch", multipart=True)
    leaders = {
        int(p): f"{n['broadcast_address']}:{n['http_port']}" for p, n in info["partitions"].items()
    }
    return topic, leaders


def publish(cluster: Any, topic: str, tag: str, per_partition: int) -> set[bytes]:
    """``per_partition`` messages of one size into every partition; their bodies."""
    bodies = {
        p: [b"%s-p%d-%04d" % (tag.encode(), p, i) for i in range(per_partition)]
        for p in range(PARTITIONS)
    }

    async def go() -> None:
        async with Producer(lookupd_http_addresses=lookupds(cluster)) as producer:
            for p, batch in bodies.items():
                await producer.publish_many(topic, batch, partition=p)

    anyio.run(go)
    return {b for batch in bodies.values() for b in batch}


def stream(spark: Any, cluster: Any, topic: str, **options: Any) -> Any:
    reader = spark.readStream.format("nsq").option("lookupd", lookupds(cluster)[0])
    reader = reader.option("topic", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def batch(spark: Any, cluster: Any, topic: str, **options: Any) -> Any:
    reader = spark.read.format("nsq").option("lookupd", lookupds(cluster)[0])
    reader = reader.option("topic", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def values(rows: list[Any]) -> list[bytes]:
    return [bytes(r.value) for r in rows]


def drain(spark: Any, cluster: Any, topic: str, **options: Any) -> list[bytes]:
    """The values a new availableNow stream reads with these options."""
    name = unique("sy_q")
    query = (
        stream(spark, cluster, topic, **options)
        .writeStream.format("memory")
        .queryName(name)
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180) and query.exception() is None
    return values(spark.sql(f"SELECT value FROM {name}").collect())


def test_restarted_stream_reads_exactly_what_it_had_not(
    spark: Any, youzan_cluster: Any, tmp_path: Any
) -> None:
    topic, _ = new_topic(youzan_cluster, "sy_restart")
    first = publish(youzan_cluster, topic, "a", 30)
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")

    def run() -> Any:
        query = (
            stream(
                spark, youzan_cluster, topic, startingOffsets="earliest", maxOffsetsPerTrigger=20
            )
            .writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", ckpt)
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(180)
        assert query.exception() is None
        return query

    query = run()
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    # maxOffsetsPerTrigger: every micro-batch at most 20 rows, so at least 5 of them.
    assert max(sizes) <= 20 and len(sizes) >= 5 and sum(sizes) == len(first)
    rows = spark.read.parquet(out).collect()
    assert sorted(values(rows)) == sorted(first)

    second = publish(youzan_cluster, topic, "b", 25)
    run()
    rows = spark.read.parquet(out).collect()
    assert sorted(values(rows)) == sorted(first | second)  # no loss, no duplicate
    assert len({(r.partition, r.offset) for r in rows}) == len(rows)
    row = rows[0]
    assert row.topic == topic and row.partition in range(PARTITIONS) and row.offset >= 0
    assert row.attempts == 1 and len(row.id) == 32 and row.timestamp is not None
    assert row.nsqd and row.headers == {} and row.trace_id == 0


def test_stream_from_json_offsets(spark: Any, youzan_cluster: Any) -> None:
    topic, _ = new_topic(youzan_cluster, "sy_json")
    publish(youzan_cluster, topic, "j", 10)
    everything = batch(spark, youzan_cluster, topic).collect()
    by_part = {
        p: sorted((r.offset, bytes(r.value)) for r in everything if r.partition == p)
        for p in range(PARTITIONS)
    }
    assert all(len(v) == 10 for v in by_part.values())
    fourth = by_part[0][3][0]
    start = json.dumps({topic: {"0": fourth, "1": -2, "2": -1}})
    got = sorted(drain(spark, youzan_cluster, topic, startingOffsets=start))
    expected = [v for _, v in by_part[0][3:]] + [v for _, v in by_part[1]]
    assert got == sorted(expected)


def test_stream_from_latest_reads_only_newer_messages(spark: Any, youzan_cluster: Any) -> None:
    topic, _ = new_topic(youzan_cluster, "sy_latest")
    publish(youzan_cluster, topic, "old", 5)
    name = unique("sy_latest_q")
    query = (
        stream(spark, youzan_cluster, topic)  # startingOffsets defaults to latest
        .writeStream.format("memory")
        .queryName(name)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        # The first trigger has run, so the starting offsets are fixed.
        wait_for(lambda: query.status["message"] != "Initializing sources", timeout=120)
        wait_for(lambda: query.lastProgress is not None, timeout=120, what="a first trigger")
        new = publish(youzan_cluster, topic, "new", 7)
        wait_for(
            lambda: spark.sql(f"SELECT count(*) AS n FROM {name}").first().n >= len(new),
            timeout=120,
            what="the new messages",
        )
        got = values(spark.sql(f"SELECT value FROM {name}").collect())
    finally:
        query.stop()
    assert sorted(got) == sorted(new)


def test_batch_read_of_a_range_leaves_other_channels_alone(spark: Any, youzan_cluster: Any) -> None:
    topic, leaders = new_topic(youzan_cluster, "sy_batch")
    publish(youzan_cluster, topic, "r", 10)
    # Channels named like a task's: one left an hour ago by a task that died, one just made.
    now = int(time.time())
    orphan, fresh = f"spark-{now - 3600:08x}deadbeef", f"spark-{now:08x}deadbeef"
    for name in (orphan, fresh):
        http_json(
            f"http://{leaders[0]}/channel/create?topic={topic}&partition=0&channel={name}", "POST"
        )
    everything = batch(spark, youzan_cluster, topic).collect()  # earliest to latest
    assert len(everything) == 10 * PARTITIONS
    offsets = {p: sorted(r.offset for r in everything if r.partition == p) for p in leaders}
    start = {"0": offsets[0][2], "1": offsets[1][0], "2": offsets[2][9]}
    end = {"0": offsets[0][5], "1": -1, "2": -1}
    rows = batch(
        spark,
        youzan_cluster,
        topic,
        startingOffsets=json.dumps({topic: start}),
        endingOffsets=json.dumps({topic: end}),
    ).collect()
    got = sorted((r.partition, r.offset) for r in rows)
    expected = [(0, o) for o in offsets[0][2:5]] + [(1, o) for o in offsets[1]]
    assert got == sorted([*expected, (2, offsets[2][9])])
    # Every partition's "ch" is where it was, the reads' own channels are gone, and so is
    # the orphan (not the fresh one: its task may be about to subscribe).
    for http in set(leaders.values()):
        stats = http_json(f"http://{http}/stats?format=json&topic={topic}")
        for t in stats["topics"]:
            channels = {
                c["channel_name"]: (c["depth"], c["in_flight_count"]) for c in t["channels"]
            }
            assert channels.pop("ch") == (10, 0)
            assert set(channels) == ({fresh} if t["topic_partition"] == "0" else set())


def test_a_range_starting_inside_a_message_reads_from_the_next(
    spark: Any, youzan_cluster: Any
) -> None:
    """An offset need not be a message boundary (Spark's maxOffsetsPerTrigger cuts anywhere):
    a range reads from the first message after it, and a range in which no message starts
    reads nothing and ends (it used to wait for a message until the stall timeout)."""
    topic, _ = new_topic(youzan_cluster, "sy_inside")
    publish(youzan_cluster, topic, "i", 10)
    everything = batch(spark, youzan_cluster, topic).collect()
    offsets = {p: sorted(r.offset for r in everything if r.partition == p) for p in range(3)}
    start = {"0": offsets[0][9] + 1, "1": offsets[1][4] + 1, "2": offsets[2][0]}
    rows = batch(spark, youzan_cluster, topic, startingOffsets=json.dumps({topic: start})).collect()
    got = sorted((r.partition, r.offset) for r in rows)
    assert got == [(1, o) for o in offsets[1][5:]] + [(2, o) for o in offsets[2]]


@pytest.mark.parametrize("per_task", [1, 2, 3])
def test_a_task_reads_several_partitions_at_once(
    spark: Any, youzan_cluster: Any, per_task: int
) -> None:
    topic, _ = new_topic(youzan_cluster, "sy_group")
    sent = publish(youzan_cluster, topic, "g", 300)
    df = batch(spark, youzan_cluster, topic, partitionsPerTask=str(per_task))
    assert df.rdd.getNumPartitions() == -(-PARTITIONS // per_task)
    rows = df.collect()
    assert sorted(values(rows)) == sorted(sent)  # each message once
    for p in range(PARTITIONS):  # in offset order within a partition
        offsets = [r.offset for r in rows if r.partition == p]
        assert len(offsets) == 300 and offsets == sorted(offsets)


def failure(action: Any) -> str:
    with pytest.raises(Exception) as info:
        action()
    return str(info.value)


def test_bad_offset_options_fail_at_planning(
    spark: Any, youzan_cluster: Any, classic_cluster: Any
) -> None:
    topic, _ = new_topic(youzan_cluster, "sy_bad")
    text = failure(lambda: stream(spark, youzan_cluster, topic, startingOffsets="{oops"))
    assert "InvalidArgument" in text and "option 'startingOffsets' must be earliest" in text
    text = failure(
        lambda: stream(spark, youzan_cluster, topic, startingOffsets=json.dumps({topic: {"7": 0}}))
    )
    assert "option 'startingOffsets' names partition(s) [7]" in text
    text = failure(
        lambda: batch(spark, youzan_cluster, topic, endingOffsets=json.dumps({"other": {"0": 1}}))
    )
    assert "option 'endingOffsets' must be a JSON object with the one key" in text
    text = failure(lambda: stream(spark, youzan_cluster, topic, maxOffsetsPerTrigger="lots"))
    assert "option 'maxOffsetsPerTrigger' must be a whole number" in text
    text = failure(lambda: batch(spark, youzan_cluster, topic, partitionsPerTask="0"))
    assert "option 'partitionsPerTask' must be >= 1, not 0" in text
    # Only the stream reader knows it is one: the query fails as it starts.
    query = stream(spark, youzan_cluster, topic, endingOffsets="latest").writeStream
    text = failure(lambda: query.format("noop").start().awaitTermination(120))
    assert "option 'endingOffsets' applies to spark.read only" in text
    nsqd = classic_cluster.nsqd[0]
    text = failure(
        lambda: (
            spark.readStream.format("nsq")
            .option("nsqd", nsqd.tcp)
            .option("topic", "t")
            .option("channel", "c")
            .option("startingOffsets", "earliest")
            .load()
        )
    )
    assert "option 'startingOffsets' needs a Youzan partitioned topic" in text


def test_ext_topic_rows_carry_headers_and_trace_ids(spark: Any, youzan_cluster: Any) -> None:
    topic = unique("sy_ext")
    create_topic(youzan_cluster, topic, partitions=1, ext=True, channel="ch")

    async def go() -> None:
        async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
            await producer.publish(topic, b"one", headers={"region": "eu", "n": 1})
            await producer.publish(topic, b"two", trace_id=(1 << 64) - 2)
            await producer.publish(topic, b"three")

    anyio.run(go)
    rows = sorted(batch(spark, youzan_cluster, topic).collect(), key=lambda r: r.offset)
    assert values(rows) == [b"one", b"two", b"three"]
    assert rows[0].headers == {"region": "eu", "n": "1"} and rows[0].offset == 0
    assert rows[1].trace_id == -2  # unsigned 64-bit on the wire, Spark's long is signed
    assert rows[2].headers == {} and rows[2].partition == 0
    # A range that starts inside the first message begins with the second.
    later = batch(spark, youzan_cluster, topic, startingOffsets=json.dumps({topic: {"0": 1}}))
    assert values(later.collect()) == [b"two", b"three"]


def test_ordered_topic_is_read_by_offsets_in_order(spark: Any, youzan_cluster: Any) -> None:
    # An ordered topic takes SUB_ORDERED only; each task reads its range one message at a
    # time, on a channel of its own, and leaves the topic's own channel where it was.
    topic = unique("sy_ordered")
    info = create_topic(youzan_cluster, topic, partitions=PARTITIONS, ordered=True, channel="ch")
    sent = publish(youzan_cluster, topic, "o", 12)
    rows = batch(spark, youzan_cluster, topic).collect()
    assert sorted(values(rows)) == sorted(sent)
    for p in range(PARTITIONS):
        mine = [r for r in rows if r.partition == p]  # in the order the task read them
        assert values(mine) == [b"o-p%d-%04d" % (p, i) for i in range(12)]
        assert [r.offset for r in mine] == sorted({r.offset for r in mine})
    # From the 5th message of partition 0, up to (not including) its 9th.
    p0 = [r.offset for r in rows if r.partition == 0]
    later = batch(
        spark,
        youzan_cluster,
        topic,
        startingOffsets=json.dumps({topic: {"0": p0[4], "1": -1, "2": -1}}),
        endingOffsets=json.dumps({topic: {"0": p0[8], "1": -1, "2": -1}}),
    ).collect()
    assert values(later) == [b"o-p0-%04d" % i for i in range(4, 8)]
    got = drain(spark, youzan_cluster, topic, startingOffsets="earliest", maxOffsetsPerTrigger=10)
    assert sorted(got) == sorted(sent)
    for p, node in info["partitions"].items():
        http = f"{node['broadcast_address']}:{node['http_port']}"
        stats = http_json(f"http://{http}/stats?format=json&topic={topic}&partition={p}")
        for t in stats["topics"]:
            if t["topic_partition"] == str(p):
                names = {c["channel_name"]: c["depth"] for c in t["channels"]}
                assert names == {"ch": 12}


def test_reads_from_and_to_a_time(spark: Any, youzan_cluster: Any) -> None:
    topic, _ = new_topic(youzan_cluster, "sy_time")

    def next_second() -> int:
        # The fork finds whole seconds: each group of messages gets a second of its own.
        now = int(time.time())
        wait_for(lambda: int(time.time()) > now, timeout=3, what="a new second")
        return int(time.time() * 1000)

    publish(youzan_cluster, topic, "a", 4)
    at_b = next_second()
    sent_b = publish(youzan_cluster, topic, "b", 4)
    at_c = next_second()
    sent_c = publish(youzan_cluster, topic, "c", 4)
    got = values(batch(spark, youzan_cluster, topic, startingTimestamp=at_b).collect())
    assert sorted(got) == sorted(sent_b | sent_c)
    got = values(
        batch(spark, youzan_cluster, topic, startingTimestamp=at_b, endingTimestamp=at_c).collect()
    )
    assert sorted(got) == sorted(sent_b)
    later = int(time.time() + 3600) * 1000  # no message yet: every partition's end
    assert batch(spark, youzan_cluster, topic, startingTimestamp=later).count() == 0
    assert sorted(drain(spark, youzan_cluster, topic, startingTimestamp=at_c)) == sorted(sent_c)
    text = failure(
        lambda: batch(
            spark, youzan_cluster, topic, startingTimestamp=at_b, startingOffsets="latest"
        )
    )
    assert "give option 'startingOffsets' or 'startingTimestamp', not both" in text
    text = failure(lambda: batch(spark, youzan_cluster, topic, endingTimestamp="yesterday"))
    assert "option 'endingTimestamp' must be a Unix time in milliseconds" in text
