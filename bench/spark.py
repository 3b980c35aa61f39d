"""Spark benchmark: the nsq data source against smartnsq used directly, on one real nsqd.

    python -m bench.spark [--rounds 3] [--quick] [--n 1000000] [--only youzan]

Workloads (100-byte bodies, one classic nsqd v1.3.0 on 127.0.0.1, Spark local[2]):
  write   df.write.format("nsq") of N rows from a cached DataFrame in 2 partitions,
          against a plain Python loop of Producer.publish_many (batches of 1000, one in
          flight) over the same bodies. Targets: sink >= 0.8x the loop and >= 400k msg/s.
  read    spark.readStream.format("nsq") with trigger(availableNow=True) into the noop sink,
          draining N messages from one channel, against a smartnsq Consumer draining the
          same N messages from a second channel of the same topic. Target: >= 0.5x.
          Also Spark's floor for that path: the same query over a stand-in source that
          has its rows ready (same schema and micro-batch size) and does no NSQ work.
  youzan  a Youzan HA cluster (etcd, 1 nsqlookupd, 2 nsqd; 4-partition topic, replica 1,
          N messages spread evenly): spark.readStream.format("nsq") by offsets from
          earliest, availableNow, into the noop sink (all partitions), against a smartnsq
          Consumer draining channel "plain" (made before the data, so it holds the same N
          messages) through lookupd. Both timed from start to the last message, start-up
          included (and the micro-batch alone, from Spark's progress). Target: >= 1.0x.

Each round runs every measurement once; the best round counts. Raw results go to
bench/results/spark-<time>.json and a Markdown summary is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import anyio

from bench import common as c

BODY = 100


def bodies(n: int) -> list[bytes]:
    return [str(i).rjust(BODY, "x").encode() for i in range(n)]


def session() -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("smartnsq-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def plain_publish(nsqd: c.Nsqd, topic: str, data: list[bytes]) -> float:
    from smartnsq import Producer

    async def go() -> float:
        async with Producer([nsqd.tcp]) as producer:
            await producer.publish_many(topic, data[:1000])  # connect outside the timing
            started = time.perf_counter()
            for i in range(1000, len(data), 1000):
                await producer.publish_many(topic, data[i : i + 1000])
            return time.perf_counter() - started

    seconds: float = anyio.run(go)
    return seconds * len(data) / (len(data) - 1000)


def plain_consume(nsqd: c.Nsqd, topic: str, channel: str, n: int) -> float:
    from smartnsq import Consumer, Message

    async def go() -> float:
        done = anyio.Event()
        count = 0
        started = 0.0

        def handle(message: Message) -> None:
            nonlocal count, started
            if not count:
                started = time.perf_counter()
            count += 1
            if count >= n:
                done.set()

        async with Consumer(
            topic, channel, handle, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=2500
        ):
            await done.wait()
            return time.perf_counter() - started

    return float(anyio.run(go))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    c.runner_arguments(ap, rounds=3, quick_help="200,000 messages, one round")
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--only", choices=("classic", "youzan"), default=None)
    a = c.parse_runner_arguments(ap, argv)
    n = a.n or (200_000 if a.quick else 1_000_000)
    _, out, data = c.new_results(
        "spark", list(argv if argv is not None else sys.argv[1:]), a.quick, a.rounds, {"n": n}
    )
    data["runs"] = []
    data_bodies = bodies(n)
    with c.benchmark_nsqd(data, out) as nsqd:
        spark = session()
        df = (
            spark.range(n, numPartitions=2)
            .selectExpr(f"CAST(lpad(CAST(id AS STRING), {BODY}, 'x') AS BINARY) AS value")
            .cache()
        )
        df.count()
        # Warm up: data-source discovery, Python workers and their pooled connections.
        df.limit(1000).write.format("nsq").mode("append").option("nsqd", nsqd.tcp).option(
            "topic", "warmup"
        ).save()
        nsqd.delete_topic("warmup")
        for r in range(a.rounds if a.only != "youzan" else 0):
            data["round"] = r
            # write: Spark sink
            topic = f"spark_w{r}"
            started = time.perf_counter()
            df.write.format("nsq").mode("append").option("nsqd", nsqd.tcp).option(
                "topic", topic
            ).save()
            secs = time.perf_counter() - started
            count = nsqd.message_count(topic)
            nsqd.delete_topic(topic)
            record(data, out, "write", "spark", n, secs, count == n, count)
            # write: plain loop over the same bodies
            topic = f"plain_w{r}"
            secs = plain_publish(nsqd, topic, data_bodies)
            count = nsqd.message_count(topic)
            nsqd.delete_topic(topic)
            record(data, out, "write", "publish_many loop", n, secs, count == n, count)
            # read: both channels of one topic get the same N messages
            topic = f"read{r}"
            nsqd.create_topic(topic)
            nsqd.create_channel(topic, "spark")
            nsqd.create_channel(topic, "plain")
            for i in range(0, n, 10_000):
                nsqd.mpub_binary(topic, b"y" * BODY, min(10_000, n - i))
            started = time.perf_counter()
            query = (
                spark.readStream.format("nsq")
                .option("nsqd", nsqd.tcp)
                .option("topic", topic)
                .option("channel", "spark")
                .option("maxMessagesPerTrigger", 50_000)
                .option("idleTimeoutMs", 1000)
                .load()
                .writeStream.format("noop")
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            # the final idle wait is not reading
            secs = time.perf_counter() - started - 1.0

            progress = [p for p in query.recentProgress if p["numInputRows"]]
            got = sum(p["numInputRows"] for p in progress)
            record(data, out, "read", "spark readStream", n, secs, got >= n, got)
            # Without the query's start-up and first batch (Python workers starting):
            later = progress[1:]
            steady = sum(p["durationMs"]["triggerExecution"] for p in later) / 1000
            rows = sum(p["numInputRows"] for p in later)
            if later and steady:
                record(data, out, "read", "spark steady state", rows, steady, True, rows)
            secs = plain_consume(nsqd, topic, "plain", n)
            record(data, out, "read", "Consumer", n, secs, True, n)
            nsqd.delete_topic(topic)
            # The same query over a source that has its rows ready and does no NSQ work:
            # what Spark's driver-side stream path costs by itself.
            floor = floor_read(spark, n, 50_000)
            record(data, out, "read", "floor", n, floor[0], True, n)
            record(data, out, "read", "floor steady state", floor[2], floor[1], True, floor[2])
        if a.only != "classic":
            youzan_rounds(spark, data, out, n, a.rounds)
        spark.stop()
    print(summary(data))
    return 0


def floor_read(spark: Any, n: int, per_trigger: int) -> tuple[float, float, int]:
    """A driver-side stream source like the classic one (same schema, Arrow batches, same
    micro-batch size) that hands out ready-made rows: (seconds for ``n`` rows with
    availableNow into noop, seconds of the micro-batches after the first, their rows)."""
    source = floor_source(n, per_trigger)
    spark.dataSource.register(source)
    started = time.perf_counter()
    query = (
        spark.readStream.format(source.name())
        .load()
        .writeStream.format("noop")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    secs = time.perf_counter() - started
    later = [p for p in query.recentProgress if p["numInputRows"]][1:]
    steady = sum(p["durationMs"]["triggerExecution"] for p in later) / 1000
    return secs, steady, int(sum(p["numInputRows"] for p in later))


def floor_source(n: int, per_trigger: int) -> Any:
    # Defined in a function so that Spark pickles the classes by value: the driver's stream
    # process need not import the bench package.
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    from smartnsq.spark.schema import default_schema

    rows = 10_000

    class FloorReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
        def __init__(self, schema: Any) -> None:
            arrow = to_arrow_schema(schema, timezone="UTC")
            given = {
                "value": pa.array([b"y" * BODY] * rows),
                "topic": pa.array(["t"] * rows),
                "timestamp": pa.array([0] * rows, pa.timestamp("us", tz="UTC")),
                "attempts": pa.array([1] * rows, pa.int32()),
                "id": pa.array(["0123456789abcdef"] * rows),
                "nsqd": pa.array(["127.0.0.1:4150"] * rows),
            }
            columns = [given.get(f.name, pa.nulls(rows, f.type)) for f in arrow]
            self.batch = pa.RecordBatch.from_arrays(columns, schema=arrow)

        def prepareForTriggerAvailableNow(self) -> None:
            pass

        def initialOffset(self) -> dict[str, int]:
            return {"seq": 0}

        def read(self, start: dict[str, int]) -> tuple[Any, dict[str, int]]:
            seq = start["seq"]
            count = min(per_trigger, n - seq)
            if count <= 0:
                return iter(()), start
            return iter([self.batch] * (count // rows)), {"seq": seq + count // rows * rows}

        def readBetweenOffsets(self, start: Any, end: Any) -> Any:
            return iter(())

    class FloorSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "nsqfloor"

        def schema(self) -> Any:
            return default_schema()

        def simpleStreamReader(self, schema: Any) -> Any:
            return FloorReader(schema)

    return FloorSource


def youzan_rounds(spark: Any, data: dict[str, Any], out: Any, n: int, rounds: int) -> None:
    import tempfile
    from pathlib import Path

    from compat.cluster import Cluster
    from compat.youzan import create_topic

    with tempfile.TemporaryDirectory(prefix="bench-youzan-") as workdir:
        cluster = Cluster.start(kind="youzan", dir=Path(workdir), nsqd=2)
        try:
            lookupd = cluster.lookupd[0].http
            # Warm up, as for classic: Python workers and their imports for this path.
            create_topic(cluster, "yz_warmup", partitions=4, multipart=True, channel="plain")
            youzan_fill(lookupd, "yz_warmup", 4000)
            youzan_read(spark, lookupd, "yz_warmup")
            for r in range(rounds):
                data["round"] = f"youzan {r}"
                topic = f"yz_read{r}"
                create_topic(cluster, topic, partitions=4, multipart=True, channel="plain")
                youzan_fill(lookupd, topic, n)
                started = time.perf_counter()
                got, batch_secs = youzan_read(spark, lookupd, topic)
                secs = time.perf_counter() - started
                record(data, out, "youzan", "spark readStream", n, secs, got == n, got)
                # The micro-batch alone, without the query's start and end.
                record(data, out, "youzan", "spark micro-batch", n, batch_secs, got == n, got)
                secs = youzan_consume(lookupd, topic, n)
                record(data, out, "youzan", "Consumer", n, secs, True, n)
        finally:
            cluster.stop()


def youzan_read(spark: Any, lookupd: str, topic: str) -> tuple[int, float]:
    """Every message of ``topic`` through the source (availableNow, noop sink): the count and
    the seconds of the micro-batches that had rows."""
    query = (
        spark.readStream.format("nsq")
        .option("lookupd", lookupd)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("noop")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    seconds = sum(p["durationMs"]["triggerExecution"] for p in batches) / 1000
    return int(sum(p["numInputRows"] for p in batches)), seconds


def youzan_fill(lookupd: str, topic: str, n: int) -> None:
    from smartnsq import Producer

    async def go() -> None:
        async with Producer(lookupd_http_addresses=[lookupd]) as producer:
            for i in range(0, n, 1000):
                batch = [b"y" * BODY] * min(1000, n - i)
                await producer.publish_many(topic, batch, partition=(i // 1000) % 4)

    anyio.run(go)


def youzan_consume(lookupd: str, topic: str, n: int) -> float:
    from smartnsq import Consumer, Message

    async def go() -> float:
        done = anyio.Event()
        count = 0

        async def handle(message: Message) -> None:
            nonlocal count
            count += 1
            if count >= n:
                done.set()

        started = time.perf_counter()
        async with Consumer(
            topic, "plain", handle, lookupd_http_addresses=[lookupd], max_in_flight=2500
        ):
            await done.wait()
            return time.perf_counter() - started

    return float(anyio.run(go))


def record(
    data: dict[str, Any],
    out: Any,
    workload: str,
    who: str,
    n: int,
    secs: float,
    ok: bool,
    seen: int,
) -> None:
    rec = {
        "round": data.get("round"),
        "workload": workload,
        "client": who,
        "n": n,
        "seconds": round(secs, 3),
        "rate": round(n / secs),
        "ok": ok,
        "seen": seen,
    }
    data["runs"].append(rec)
    out.write_text(json.dumps(data, indent=1) + "\n")
    c.log(
        f"{workload:5s} {who:18s} {n / secs:>10,.0f} msg/s  {secs:.2f} s  seen {seen}"
        + ("" if ok else "  FAILED")
    )


def summary(data: dict[str, Any]) -> str:
    """Best round of each measurement, and the ratios against the targets (a target counts
    as met by the median of the per-round ratios); a workload that was not run is left out."""
    best: dict[tuple[str, str], float] = {}
    by_round: dict[tuple[Any, str, str], float] = {}
    for rec in data["runs"]:
        if rec["ok"]:
            key = (rec["workload"], rec["client"])
            best[key] = max(best.get(key, 0.0), rec["rate"])
            by_round[(rec.get("round"), *key)] = rec["rate"]
    rounds = sorted({r for r, _, _ in by_round}, key=str)
    n = data["params"]["n"]
    rows = [
        # (label, Spark side, direct side, target ratio, also at least this rate)
        (
            f"write {n:,} x {BODY} B",
            ("write", "spark"),
            ("write", "publish_many loop"),
            0.8,
            400_000,
        ),
        (f"classic read {n:,}", ("read", "spark readStream"), ("read", "Consumer"), 0.5, 0),
        (
            "classic read, micro-batches after the first",
            ("read", "spark steady state"),
            ("read", "Consumer"),
            0.5,
            0,
        ),
        (
            "Spark's floor: the same query, rows ready, no NSQ",
            ("read", "floor"),
            ("read", "Consumer"),
            None,
            0,
        ),
        (
            "Spark's floor, micro-batches after the first",
            ("read", "floor steady state"),
            ("read", "Consumer"),
            None,
            0,
        ),
        (
            f"Youzan read by offsets {n:,}",
            ("youzan", "spark readStream"),
            ("youzan", "Consumer"),
            1.0,
            0,
        ),
        (
            "Youzan read, the micro-batch alone",
            ("youzan", "spark micro-batch"),
            ("youzan", "Consumer"),
            1.0,
            0,
        ),
    ]
    lines = [
        f"command: {data['command']}",
        "Best round of each side, and the ratio of the two sides within each round:",
        "| workload | Spark | smartnsq direct | ratio of the bests | ratio per round"
        " (median) | target | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, spark_key, direct_key, target, at_least in rows:
        if spark_key not in best or direct_key not in best:
            continue
        spark_rate, direct = best[spark_key], best[direct_key]
        ratio = spark_rate / direct
        per_round = [
            by_round[(r, *spark_key)] / by_round[(r, *direct_key)]
            for r in rounds
            if (r, *spark_key) in by_round and (r, *direct_key) in by_round
        ]
        each = ", ".join(f"{x:.2f}" for x in per_round)
        middle = statistics.median(per_round) if per_round else 0.0
        if target is None:
            goal, met = "(reference)", "-"
        else:
            goal = f">= {target}x" + (f" and >= {at_least // 1000}k msg/s" if at_least else "")
            met = "yes" if middle >= target and spark_rate >= at_least else "no"
        lines.append(
            f"| {label} | {spark_rate:,.0f} msg/s | {direct:,.0f} msg/s | {ratio:.2f}x | "
            f"{each} ({middle:.2f}x) | {goal} | {met} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
