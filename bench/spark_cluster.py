"""The nsq source on a real standalone Spark cluster, run by hand (not in CI).

    python -m bench.spark_cluster [--n 20000] [--only youzan|classic] [--per-trigger 1000]

Starts a Spark master and 2 workers (1 core, 1 GiB each) on 127.0.0.1 from PySpark's own
``bin/spark-class`` (the pip package has no ``sbin/start-master.sh``), and for each kind of
NSQ cluster (compat/, throw-away):

1. publishes the first half of N numbered messages, starts a driver (a separate process,
   ``--master spark://...``) running ``readStream.format("nsq")`` -> parquet with a
   checkpoint (processingTime 1 s, at most ``--per-trigger`` messages per micro-batch),
   and publishes the second half while it runs;
2. once the checkpoint has committed 2 micro-batches, kills the driver's process group
   (Python and its JVM) with SIGKILL;
3. starts the driver again on the same checkpoint with ``trigger(availableNow=True)``, then
   reads the parquet output (through Spark, so only committed files count) and compares the
   ids with what was published.

Verdict: Youzan (offsets in the checkpoint) must have every id exactly once; classic (FIN
after the micro-batch, nsq.msg_timeout=10 s so what the dead driver held comes back soon)
must have every id at least once, duplicates counted. Every process it starts is stopped on
the way out (SIGTERM, then SIGKILL of each process group). Exit status 0 if every verdict held.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHECK_EVERY = 0.2  # seconds between polls of a condition that has a deadline


def log(msg: str) -> None:
    print(f"[spark_cluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def poll(what: str, check: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(CHECK_EVERY)


def spark_env() -> dict[str, str]:
    import pyspark

    return {
        **os.environ,
        "SPARK_HOME": os.path.dirname(pyspark.__file__),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_DAEMON_MEMORY": "256m",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),  # this checkout's smartnsq, on the driver and executors
    }


def stop_group(proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """SIGTERM the process group, SIGKILL it after ``grace``; wait until it is gone."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
            gone = lambda: not group_alive(proc.pid)  # noqa: E731
            poll(f"process group {proc.pid} to exit", gone, wait)
            return
        except (subprocess.TimeoutExpired, TimeoutError):
            continue


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@contextmanager
def spark_standalone(work: Path, workers: int = 2) -> Iterator[str]:
    """A master and ``workers`` workers on loopback; yields the master URL."""
    env = spark_env()
    spark_class = str(Path(env["SPARK_HOME"]) / "bin" / "spark-class")
    port, ui = free_port(), free_port()
    procs: list[subprocess.Popen[Any]] = []

    def start(name: str, argv: list[str]) -> None:
        out = open(work / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        procs.append(
            subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True)
        )  # fmt: skip
        out.close()

    try:
        master = f"spark://127.0.0.1:{port}"
        listen = ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)]
        start("master", [spark_class, "org.apache.spark.deploy.master.Master", *listen])
        for i in range(workers):
            (work / f"worker{i}").mkdir()
            start(f"worker{i}", [spark_class, "org.apache.spark.deploy.worker.Worker",
                                 "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                                 "--webui-port", str(free_port()),
                                 "--work-dir", str(work / f"worker{i}"), master])  # fmt: skip

        def alive() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as r:
                    state = json.load(r)
            except OSError:
                return False
            alive_workers = [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]
            return len(alive_workers) == workers

        poll(f"the master and {workers} workers", alive, 120)
        log(f"standalone Spark up: {master}, {workers} workers (logs in {work})")
        yield master
    finally:
        for proc in reversed(procs):
            stop_group(proc)
        log("standalone Spark stopped")


# ---- the driver (a separate process, so that it can be killed with SIGKILL) ----


def driver(config: dict[str, Any]) -> None:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(config["master"])
        .appName(f"smartnsq-cluster-{config['kind']}")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "512m")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.executorEnv.PYTHONPATH", str(ROOT))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    reader = spark.readStream.format("nsq")
    for k, v in config["options"].items():
        reader = reader.option(k, str(v))
    writer = (
        reader.load()
        .selectExpr("CAST(value AS STRING) AS value")
        .writeStream.format("parquet")
        .option("path", config["out"])
        .option("checkpointLocation", config["checkpoint"])
    )
    if config["phase"] == "run":
        query = writer.trigger(processingTime="1 second").start()
        print("STARTED", flush=True)
        query.awaitTermination()  # until killed
        return
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    values = [r.value for r in spark.read.parquet(config["out"]).collect()]
    print("RESULT " + json.dumps({"values": values}), flush=True)
    spark.stop()


def run_driver(config: dict[str, Any], log_path: Path) -> subprocess.Popen[Any]:
    """The driver in a session of its own; stdout is piped only for the run that ends."""
    out = open(log_path, "ab")  # noqa: SIM115 - the child has its own copy
    stdout = subprocess.PIPE if config["phase"] == "finish" else out
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.spark_cluster", "--driver", json.dumps(config)],
        env=spark_env(), cwd=ROOT, stdout=stdout, stderr=out, start_new_session=True,
    )  # fmt: skip
    out.close()
    return proc


# ---- one kind of NSQ cluster ----


def publish(
    kind: str,
    cluster: Any,
    topic: str,
    ids: range,
    pace: float = 0.0,
    done: list[int] | None = None,
) -> None:
    """Publish the ids in batches of 250, ``pace`` seconds apart; ``done`` counts them."""
    import anyio

    from smartnsq import Producer

    bodies = [b"%s-%07d" % (kind.encode(), i) for i in ids]

    async def go() -> None:
        if kind == "youzan":
            producer = Producer(lookupd_http_addresses=[cluster.lookupd[0].http])
        else:
            producer = Producer([cluster.nsqd[0].tcp])
        async with producer:
            for i in range(0, len(bodies), 250):
                await producer.publish_many(topic, bodies[i : i + 250])
                if done is not None:
                    done[0] += len(bodies[i : i + 250])
                await anyio.sleep(pace)  # spread over the run: the kill lands mid-stream

    anyio.run(go)


def one_kind(kind: str, master: str, work: Path, n: int, per_trigger: int) -> dict[str, Any]:
    from compat.cluster import Cluster
    from compat.youzan import create_topic

    topic = f"cluster_{kind}"
    with Cluster.start(kind=kind, dir=work / "nsq", nsqd=2 if kind == "youzan" else 1) as nsq:
        if kind == "youzan":
            create_topic(nsq, topic, partitions=3, channel="ch", multipart=True)
            options: dict[str, Any] = {"lookupd": nsq.lookupd[0].http, "topic": topic,
                                       "startingOffsets": "earliest",
                                       "maxOffsetsPerTrigger": per_trigger}  # fmt: skip
        else:
            base = f"http://{nsq.nsqd[0].http}"
            for path in (f"/topic/create?topic={topic}",
                         f"/channel/create?topic={topic}&channel=spark"):  # fmt: skip
                urllib.request.urlopen(urllib.request.Request(base + path, method="POST")).close()
            options = {"nsqd": nsq.nsqd[0].tcp, "topic": topic, "channel": "spark",
                       "maxMessagesPerTrigger": per_trigger, "nsq.msg_timeout": 10,
                       "idleTimeoutMs": 20000}  # fmt: skip
        config = {"kind": kind, "master": master, "options": options,
                  "out": str(work / "out"), "checkpoint": str(work / "checkpoint")}  # fmt: skip
        publish(kind, nsq, topic, range(n // 2))
        started = time.monotonic()
        first = run_driver({**config, "phase": "run"}, work / "driver.log")
        published = [0]
        rest = threading.Thread(
            target=publish, args=(kind, nsq, topic, range(n // 2, n), 0.5, published)
        )
        try:
            commits = work / "checkpoint" / "commits"

            def committed() -> int:
                if first.poll() is not None:
                    raise RuntimeError(f"the driver exited ({first.returncode}): see driver.log")
                return len([p for p in commits.glob("[0-9]*")]) if commits.exists() else 0

            # The second half starts after the first micro-batch and takes a while (40
            # batches of 250 half a second apart for 20,000), so the kill comes mid-stream.
            poll("a committed micro-batch", lambda: committed() >= 1, 600)
            rest.start()
            poll("2 committed micro-batches", lambda: committed() >= 2, 300)
            at_kill, published_at_kill = committed(), n // 2 + published[0]
            os.killpg(first.pid, signal.SIGKILL)  # the driver and its JVM, no clean-up
            first.wait()
            poll("the killed driver's processes to exit", lambda: not group_alive(first.pid), 30)
            took = time.monotonic() - started
            log(f"{kind}: driver killed with SIGKILL after {at_kill} committed micro-batches "
                f"({took:.0f} s), {published_at_kill} of {n} published")  # fmt: skip
        finally:
            stop_group(first)
            if rest.ident is not None:
                rest.join()
        second = run_driver({**config, "phase": "finish"}, work / "driver.log")
        try:
            stdout, _ = second.communicate(timeout=600)
        finally:
            stop_group(second)
        lines = [x for x in stdout.decode().splitlines() if x.startswith("RESULT ")]
        if second.returncode != 0 or not lines:
            raise RuntimeError(f"the restarted driver failed ({second.returncode}): see driver.log")
        values: list[str] = json.loads(lines[0][len("RESULT ") :])["values"]
    sent = {f"{kind}-{i:07d}" for i in range(n)}
    got = set(values)
    return {
        "kind": kind,
        "sent": n,
        "rows": len(values),
        "distinct": len(got),
        "missing": len(sent - got),
        "unexpected": len(got - sent),
        "duplicates": len(values) - len(got),
        "committed_at_kill": at_kill,
        "published_at_kill": published_at_kill,
    }


def verdict(r: dict[str, Any]) -> tuple[bool, str]:
    complete = r["missing"] == 0 and r["unexpected"] == 0
    if r["kind"] == "youzan":
        ok = complete and r["duplicates"] == 0
        return ok, "exactly-once held" if ok else "exactly-once BROKEN"
    return complete, "at-least-once held" if complete else "at-least-once BROKEN (ids lost)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="messages per kind (default 20000)")
    ap.add_argument("--per-trigger", type=int, default=1000, help="max messages per micro-batch")
    ap.add_argument("--only", choices=["youzan", "classic"], help="one kind of NSQ cluster")
    ap.add_argument("--driver", help=argparse.SUPPRESS)  # internal: run as the driver
    args = ap.parse_args(argv)
    if args.driver:
        driver(json.loads(args.driver))
        return 0
    kinds = [args.only] if args.only else ["youzan", "classic"]
    results = []
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="spark-cluster-")))
        load = os.getloadavg()[0]
        master = stack.enter_context(spark_standalone(work))
        for kind in kinds:
            (work / kind).mkdir()
            t0 = time.monotonic()
            r = one_kind(kind, master, work / kind, args.n, args.per_trigger)
            r["seconds"] = round(time.monotonic() - t0, 1)
            r["load_before"], r["load_after"] = round(load, 2), round(os.getloadavg()[0], 2)
            load = os.getloadavg()[0]
            results.append(r)
            log(json.dumps(r))
    print("| kind | sent | rows | distinct | missing | duplicates | committed at kill | "
          "seconds | other load | verdict |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    for r in results:
        held, text = verdict(r)
        ok = ok and held
        print(f"| {r['kind']} | {r['sent']} | {r['rows']} | {r['distinct']} | {r['missing']} | "
              f"{r['duplicates']} | {r['committed_at_kill']} | {r['seconds']} | "
              f"{r['load_before']}-{r['load_after']} | {text} |")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
