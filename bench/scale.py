"""Scale benchmark: one process with many Consumers and one Producer.

A classic cluster of one nsqlookupd and two nsqd (``compat.cluster``); every run creates its
own --topics topics on both nsqd first (so lookupd discovery gives every Consumer two
connections, and no run starts with an earlier run's backlog) and deletes them after.
The driver (``drivers/scale_smartnsq.py``, or the go-nsq program's ``scale``) creates one
Consumer per topic (max_in_flight 200, lookupd discovery) and, once all are subscribed, one
Producer. Measured from outside through /proc: start-up time (first consumer created to every
connection subscribed, as the driver reports it), idle CPU share with no traffic (heartbeats
and timers only), CPU per message while publishing --rate msg/s to every topic (published and
consumed in the same process), resident memory (VmRSS) and open descriptors.

    python -m bench.scale [--rounds 2] [--topics 100,1000] [--rate 100]
                          [--idle 30] [--load 10] [--clients smartnsq,go-nsq] [--quick]

Raw results: bench/results/scale-<time>.json; a full run rewrites "## Scale" in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench import common as c
from bench.gobuild import ensure_nsqgo

LABELS = {
    "smartnsq": "smartnsq (asyncio)",
    "smartnsq-uvloop": "smartnsq (uvloop)",
    "smartnsq-c1": "smartnsq (asyncio), concurrency=1",
    "go-nsq": "go-nsq v1.1.0, GOMAXPROCS=1",
}
_CLK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    st = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(st[11]) + int(st[12])) / _CLK


def proc_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def proc_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Driver:
    """The driver process: its stdout lines as a queue, commands to its stdin."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
            start_new_session=True,
        )
        self.pid = self.proc.pid
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def expect(self, kind: str, timeout: float) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"no {kind} line from the driver in {timeout:g} s") from None
            if line is None:
                raise RuntimeError(f"the driver exited before its {kind} line")
            if line.startswith(kind + " "):
                return dict(json.loads(line[len(kind) + 1 :]))

    def send(self, cmd: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def count(self) -> dict[str, Any]:
        self.send("count")
        return self.expect("COUNT", 30)

    def stop(self) -> str:
        try:
            self.send("stop")
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        return (self.proc.stderr.read() if self.proc.stderr else "")[-1500:]


def run_one(
    client: str, topics: int, cluster: Any, nsqgo: Path, a: argparse.Namespace
) -> dict[str, Any]:
    nsqd = [d.tcp for d in cluster.nsqd]
    lookupd = cluster.lookupd[0].http
    prefix = f"s{uuid.uuid4().hex[:8]}"  # fresh topics: no backlog from an earlier run
    topic_names = [f"{prefix}_{i:04d}" for i in range(topics)]
    nodes = [c.Nsqd(tcp=d.tcp, http=d.http, bins={}) for d in cluster.nsqd]
    for n in nodes:
        for t in topic_names:
            n.create_topic(t)
    if client == "go-nsq":
        env = dict(os.environ, GOMAXPROCS="1")
        cmd = [str(nsqgo), "scale", "-lookupd", lookupd, "-nsqd", ",".join(nsqd)]
        cmd += ["-topics", str(topics), "-rate", str(a.rate), "-prefix", prefix]
    else:
        env = dict(os.environ, PYTHONPATH=str(c.ROOT))
        cmd = [sys.executable, str(c.DRIVERS / "scale_smartnsq.py"), "--lookupd", lookupd]
        cmd += ["--nsqd", ",".join(nsqd), "--topics", str(topics), "--rate", str(a.rate)]
        cmd += ["--prefix", prefix]
        cmd += ["--variant", "uvloop" if client == "smartnsq-uvloop" else ""]
        if client == "smartnsq-c1":
            cmd += ["--concurrency", "1"]
    rec: dict[str, Any] = {"client": client, "topics": topics, "cmd": shlex.join(cmd), "ok": False}
    drv = Driver(cmd, env)
    try:
        t0 = drv.expect("STARTING", 60)["t"]
        sub = drv.expect("SUBSCRIBED", a.start_timeout)
        rec["startup_s"] = sub["t"] - t0
        rec["connections"] = sub["connections"]
        time.sleep(a.settle)
        cpu0, w0, snap0 = proc_cpu(drv.pid), time.monotonic(), c.cpu_snapshot(None)
        time.sleep(a.idle)
        cpu1, w1, snap1 = proc_cpu(drv.pid), time.monotonic(), c.cpu_snapshot(None)
        # the share of the machine busy with anything else (nsqd included) while idle
        rec["other_cpu_frac"] = c.cpu_delta(snap0, snap1, cpu1 - cpu0).get("other_cpu_frac")
        rec["idle_cpu_share"] = (cpu1 - cpu0) / (w1 - w0)
        rec["idle_rss_kb"] = proc_rss_kb(drv.pid)
        rec["idle_fds"] = proc_fds(drv.pid)
        drv.send("load")
        time.sleep(a.settle)
        n0, cpu0, w0 = drv.count(), proc_cpu(drv.pid), time.monotonic()
        time.sleep(a.load)
        n1, cpu1, w1 = drv.count(), proc_cpu(drv.pid), time.monotonic()
        handled = n1["handled"] - n0["handled"]
        rec["offered_rate"] = a.rate * topics
        rec["published_rate"] = (n1["published"] - n0["published"]) / (w1 - w0)
        rec["handled_rate"] = handled / (w1 - w0)
        rec["load_cpu_share"] = (cpu1 - cpu0) / (w1 - w0)
        # each message is published and consumed in this process: CPU for both, per message
        rec["cpu_us_per_msg"] = (cpu1 - cpu0) / max(1, handled) * 1e6
        rec["load_rss_kb"] = proc_rss_kb(drv.pid)
        rec["load_fds"] = proc_fds(drv.pid)
        rec["nsqd_connections"] = 2 * topics + len(nsqd)  # consumers + the producer
        rec["ok"] = True
    except Exception as e:
        rec["error"] = str(e)
    err = drv.stop()
    if not rec["ok"]:
        rec["stderr_tail"] = err
    for n in nodes:
        for t in topic_names:
            n.delete_topic(t)
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    c.runner_arguments(ap, 2, "1 round, 5 s idle and 5 s load windows")
    ap.add_argument("--topics", default="100,1000")
    ap.add_argument("--rate", type=float, default=100.0, help="msg/s per topic")
    ap.add_argument("--idle", type=float, default=None, help="idle window, seconds (30)")
    ap.add_argument("--load", type=float, default=None, help="load window, seconds (10)")
    ap.add_argument("--settle", type=float, default=2.0)
    ap.add_argument(
        "--start-timeout", type=float, default=180.0, help="seconds allowed to subscribe all"
    )
    ap.add_argument("--clients", default="smartnsq,smartnsq-uvloop,smartnsq-c1,go-nsq")
    a = c.parse_runner_arguments(ap, argv)
    a.idle = a.idle if a.idle is not None else (5.0 if a.quick else 30.0)
    a.load = a.load if a.load is not None else (5.0 if a.quick else 10.0)
    sizes = [int(x) for x in a.topics.split(",")]
    clients = a.clients.split(",")
    nsqgo = ensure_nsqgo()
    params = {
        "topics": sizes,
        "rate": a.rate,
        "idle": a.idle,
        "load": a.load,
        "settle": a.settle,
        "clients": clients,
        "labels": {k: LABELS[k] for k in clients},
        "source_digest": c.source_digest(),
    }
    _, out, data = c.new_results(
        "scale", list(argv if argv is not None else sys.argv[1:]), a.quick, a.rounds, params
    )
    data["runs"] = []
    if str(c.ROOT) not in sys.path:
        sys.path.insert(0, str(c.ROOT))
    from compat.cluster import Cluster

    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        cluster = Cluster.start(kind="classic", dir=Path(tmp), nsqd=2, lookupd=1)
        try:
            data["nsqd_version"] = c.NSQD_VERSION
            c.log(f"cluster up; results -> {c.rel(out)}")
            for rnd in range(1, a.rounds + 1):
                for topics in sizes:
                    k = (rnd - 1) % len(clients)
                    for client in clients[k:] + clients[:k]:
                        rec = run_one(client, topics, cluster, nsqgo, a)
                        rec["round"] = rnd
                        data["runs"].append(rec)
                        out.write_text(json.dumps(data, indent=1) + "\n")
                        c.log(f"r{rnd} {topics:>5} {client:<16} " + summary(rec))
        finally:
            cluster.stop()
    if a.md if a.md is not None else not a.quick:
        from bench.summarize_more import scale_section

        c.replace_md_section(c.BENCHMARKS_MD, "Scale", scale_section(data))
        c.log(f"rewrote '## Scale' in {c.rel(c.BENCHMARKS_MD)}")
    return 0


def summary(rec: dict[str, Any]) -> str:
    if not rec["ok"]:
        return f"FAILED: {rec.get('error')}"
    return (
        f"start {rec['startup_s']:.2f} s  idle {rec['idle_cpu_share'] * 100:.2f} %  "
        f"load {rec['load_cpu_share'] * 100:.0f} % ({rec['handled_rate']:.0f}/"
        f"{rec['offered_rate']:.0f} msg/s, {rec['cpu_us_per_msg']:.1f} us/msg)  "
        f"rss {rec['load_rss_kb'] / 1024:.0f} MiB  fds {rec['load_fds']} "
        f"(conns {rec['nsqd_connections']})"
    )


if __name__ == "__main__":
    raise SystemExit(main())
