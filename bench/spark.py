"""Spark benchmark: the nsq data source against smartnsq used directly, on one real nsqd.

    python -m bench.spark [--rounds 3] [--quick] [--n 1000000] [--only youzan]

Workloads (100-byte bodies, one classic nsqd v1.3.0 on 127.0.0.1, Spark local[2]):
  write   df.write.format("nsq") of N rows from a cached DataFrame in 2 partitions,
          against a plain Python loop of Producer.publish_many (batches of 1000, one in
          flight) over the same bodies. Targets: sink >= 0.8x the loop and >= 400k msg/s.
  read    spark.readStream.format("nsq") with trigger(availableNow=True) into the noop sink,
          draining N messages from one channel, against a smartnsq Consumer draining the
          same N messages from a second channel of the same topic. Target: >= 0.5x.
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
        if a.only != "classic":
            youzan_rounds(spark, data, out, n, a.rounds)
        spark.stop()
    print(summary(data))
    return 0


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
    best: dict[tuple[str, str], float] = {}
    for rec in data["runs"]:
        if rec["ok"]:
            key = (rec["workload"], rec["client"])
            best[key] = max(best.get(key, 0.0), rec["rate"])
    w_spark = best.get(("write", "spark"), 0.0)
    w_plain = best.get(("write", "publish_many loop"), 1.0)
    r_spark = best.get(("read", "spark readStream"), 0.0)
    r_plain = best.get(("read", "Consumer"), 1.0)
    r_steady = best.get(("read", "spark steady state"), 0.0)
    y_spark = best.get(("youzan", "spark readStream"), 0.0)
    y_plain = best.get(("youzan", "Consumer"), 1.0)
    y_batch = best.get(("youzan", "spark micro-batch"), 0.0)
    lines = [
        f"command: {data['command']}",
        "| workload | Spark | smartnsq direct | ratio | target | met |",
        "|---|---|---|---|---|---|",
        f"| write {data['params']['n']:,} x {BODY} B | {w_spark:,.0f} msg/s | "
        f"{w_plain:,.0f} msg/s | {w_spark / w_plain:.2f}x | >= 0.8x and >= 400k msg/s | "
        f"{'yes' if w_spark >= 0.8 * w_plain and w_spark >= 400_000 else 'no'} |",
        f"| classic read {data['params']['n']:,} | {r_spark:,.0f} msg/s | "
        f"{r_plain:,.0f} msg/s | {r_spark / r_plain:.2f}x | >= 0.5x | "
        f"{'yes' if r_spark >= 0.5 * r_plain else 'no'} |",
        f"| classic read, micro-batches after the first | {r_steady:,.0f} msg/s | "
        f"{r_plain:,.0f} msg/s | {r_steady / r_plain:.2f}x | >= 0.5x | "
        f"{'yes' if r_steady >= 0.5 * r_plain else 'no'} |",
        f"| Youzan read by offsets {data['params']['n']:,} | {y_spark:,.0f} msg/s | "
        f"{y_plain:,.0f} msg/s | {y_spark / y_plain:.2f}x | >= 1.0x | "
        f"{'yes' if y_spark >= y_plain else 'no'} |",
        f"| Youzan read, the micro-batch alone | {y_batch:,.0f} msg/s | "
        f"{y_plain:,.0f} msg/s | {y_batch / y_plain:.2f}x | >= 1.0x | "
        f"{'yes' if y_batch >= y_plain else 'no'} |",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
