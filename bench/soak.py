"""Soak run (not in CI): publish and consume for a long while through network faults and nsqd
restarts, and watch this process's memory and file descriptors.

    python -m bench.soak --minutes 20          # what BENCHMARKS.md's "Soak" section reports
    python -m bench.soak --minutes 3 --fault-every 20 --warmup 1   # a quick look

Two classic nsqd and one nsqlookupd on loopback, every port behind Toxiproxy (compat). One
``smartnsq.Producer`` shared by 8 tasks publishes to both nsqd; one ``smartnsq.Consumer``
(async handler) finds them through the lookupd. Every ``--fault-every`` seconds one fault
strikes one nsqd, in turn: a restart (SIGTERM, then the same ports and data), a silent link,
connection resets, refused connections, 300 ms latency, 1-7 byte slicing, a 4 KB/s
bandwidth cap (each fault but the restart held ``--fault-for`` seconds, then healed).
Every 10 s the process's RSS and open file descriptors are sampled; at the end, the least
squares slope of RSS after ``--warmup`` minutes, the file descriptors just before each
fault (they should return to the first such baseline), and the message counts: every
acknowledged publish must have been handled (exit status 1 if not).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from compat.cluster import http_request
from compat.toxiproxy import ProxiedClassic, Proxy, Toxiproxy, start_proxied_classic
from smartnsq import Consumer, Message, Producer
from smartnsq.errors import NSQError

PUBLISHERS = 8
SAMPLE_EVERY = 10.0
FAULTS = ("restart", "silent", "reset", "refused", "latency", "slicer", "bandwidth")


def rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def slope(points: list[tuple[float, float]]) -> float:
    """Least squares slope of ``(x, y)`` points (0 with fewer than two)."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else 0.0


ACKED, HANDLED = 1, 2


@dataclass
class State:
    # one byte of flags per message (so the bookkeeping grows by well under 0.1 MB a minute
    # and does not hide a leak of the client): marks[task][i]
    marks: list[bytearray] = field(default_factory=lambda: [bytearray() for _ in range(PUBLISHERS)])
    acked: int = 0
    handled: int = 0
    duplicates: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    foreign: list[str] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    publishing: bool = True

    def mark(self, task: int, i: int, flag: int) -> int:
        row = self.marks[task]
        if i >= len(row):
            row.extend(bytes(i + 1024 - len(row)))
        before = row[i]
        row[i] |= flag
        return before

    def ack(self, task: int, i: int) -> None:
        self.acked += 1
        self.mark(task, i, ACKED)

    def handle(self, body: bytes) -> None:
        task, i = body.split(b":")
        self.handled += 1
        if self.mark(int(task), int(i), HANDLED) & HANDLED:
            self.duplicates += 1

    def lost(self) -> int:
        return sum(1 for row in self.marks for f in row if f & ACKED and not f & HANDLED)


def inject(cluster: ProxiedClassic, fault: str, node: int) -> None:
    proxies: list[Proxy] = cluster.nodes(node)
    for p in proxies:
        if fault == "silent":
            p.silence()
        elif fault == "reset":
            p.reset_peer()
        elif fault == "refused":
            p.refuse()
        elif fault == "latency":
            p.latency(300, 100, streams=("downstream",))
        elif fault == "slicer":
            p.slicer(4, 3)
        elif fault == "bandwidth":
            p.bandwidth(4)


def heal(cluster: ProxiedClassic, node: int) -> None:
    for p in cluster.nodes(node):
        p.heal()


def restart(cluster: ProxiedClassic, node: int) -> None:
    cluster.cluster.kill_nsqd(node, signal.SIGTERM)
    cluster.cluster.restart_nsqd(node)


async def soak(args: argparse.Namespace, cluster: ProxiedClassic) -> State:
    state = State()
    topic, channel = f"soak_{os.getpid()}", "ch"
    started = time.monotonic()
    end = started + args.minutes * 60

    async def publisher(producer: Producer, task: int) -> None:
        i = 0
        while state.publishing:
            body = b"%d:%d" % (task, i)
            i += 1
            try:
                await producer.publish(topic, body)
            except NSQError as exc:
                state.errors[type(exc).__name__] += 1
            except Exception as exc:  # not a smartnsq.errors type: reported as a failure
                state.foreign.append(repr(exc))
            else:
                state.ack(task, i - 1)
            await anyio.sleep(args.pace)

    async def handle(message: Message) -> None:
        state.handle(message.body)

    async def sampler() -> None:
        while True:
            state.samples.append(
                {
                    "t": round(time.monotonic() - started, 1),
                    "rss": rss_bytes(),
                    "fds": open_fds(),
                    "acked": state.acked,
                    "handled": state.handled,
                }
            )
            await anyio.sleep(SAMPLE_EVERY)

    async def faults() -> None:
        # fault k strikes at k x fault_every, whatever the previous one took
        k = 1
        while started + k * args.fault_every + args.fault_for < end:
            await anyio.sleep(max(0.0, started + k * args.fault_every - time.monotonic()))
            fault, node = FAULTS[(k - 1) % len(FAULTS)], ((k - 1) // len(FAULTS)) % 2
            k += 1
            record = {"t": round(time.monotonic() - started, 1), "fault": fault, "node": node}
            record["fds_before"] = open_fds()
            if fault == "restart":
                await anyio.to_thread.run_sync(restart, cluster, node)
            else:
                await anyio.to_thread.run_sync(inject, cluster, fault, node)
                await anyio.sleep(args.fault_for)
                await anyio.to_thread.run_sync(heal, cluster, node)
            state.faults.append(record)
            print(f"[soak] {record}", file=sys.stderr, flush=True)

    for d in cluster.cluster.nsqd:  # topic and channel known to the lookupd from the start
        http_request(f"http://{d.http}/topic/create?topic={topic}", "POST")
        http_request(f"http://{d.http}/channel/create?topic={topic}&channel={channel}", "POST")
    heartbeat, poll = 2.0, 5.0
    async with (
        Producer(
            [p.address for p in cluster.nsqd_tcp],
            timeout=3.0,
            max_retries=2,
            heartbeat_interval=heartbeat,
            lookupd_poll_interval=poll,
        ) as producer,
        Consumer(
            topic,
            channel,
            handle,
            lookupd_http_addresses=[p.address for p in cluster.lookupd_http],
            max_in_flight=100,
            reconnect_min=0.2,
            reconnect_max=2.0,
            msg_timeout=5.0,
            heartbeat_interval=heartbeat,
            lookupd_poll_interval=poll,
        ),
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(sampler)
        tg.start_soon(faults)
        async with anyio.create_task_group() as pubs:
            for task in range(PUBLISHERS):
                pubs.start_soon(publisher, producer, task)
            await anyio.sleep(max(0.0, end - time.monotonic()))
            state.publishing = False
        await anyio.to_thread.run_sync(cluster.toxiproxy.heal)
        with anyio.move_on_after(60):
            while state.lost():
                await anyio.sleep(0.5)
        tg.cancel_scope.cancel()
    return state


def report(args: argparse.Namespace, state: State) -> dict[str, Any]:
    warm = args.warmup * 60
    after = [s for s in state.samples if s["t"] >= warm]
    mb = 1024 * 1024
    rss_slope = slope([(s["t"] / 60, s["rss"] / mb) for s in after])  # MB per minute
    fd_slope = slope([(s["t"] / 60, float(s["fds"])) for s in after])
    baseline = state.faults[0]["fds_before"] if state.faults else open_fds()
    lost = state.lost()
    return {
        "minutes": args.minutes,
        "warmup_minutes": args.warmup,
        "faults": len(state.faults),
        "acked": state.acked,
        "handled": state.handled,
        "lost": lost,
        "duplicates": state.duplicates,
        "errors": dict(state.errors),
        "foreign_errors": state.foreign[:5],
        "rss_mb_at_warmup": round(after[0]["rss"] / mb, 1) if after else None,
        "rss_mb_at_end": round(after[-1]["rss"] / mb, 1) if after else None,
        "rss_growth_mb_after_warmup": round((after[-1]["rss"] - after[0]["rss"]) / mb, 2)
        if after
        else None,
        "rss_slope_mb_per_min": round(rss_slope, 3),
        "fds_baseline": baseline,
        "fds_before_each_fault": [f["fds_before"] for f in state.faults],
        "fds_max_above_baseline": max(
            (f["fds_before"] - baseline for f in state.faults), default=0
        ),
        "fds_slope_per_min": round(fd_slope, 3),
        "samples": state.samples,
    }


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--fault-every", type=float, default=60.0, help="seconds between faults")
    parser.add_argument("--fault-for", type=float, default=10.0, help="seconds a toxic is held")
    parser.add_argument("--warmup", type=float, default=2.0, help="minutes left out of the slope")
    parser.add_argument("--pace", type=float, default=0.02, help="each publisher's pause, s")
    parser.add_argument("--out", type=Path, help="write the full report (JSON) here")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # a stopped soak still stops its servers
    with tempfile.TemporaryDirectory(prefix="smartnsq-soak-") as tmp:
        toxi = Toxiproxy.start(Path(tmp) / "toxiproxy")
        try:
            cluster = start_proxied_classic(toxi, Path(tmp) / "cluster", nsqd=2, lookupd=1)
            try:
                state = anyio.run(soak, args, cluster)
            finally:
                cluster.stop()
        finally:
            toxi.stop()
    result = report(args, state)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    brief = {k: v for k, v in result.items() if k != "samples"}
    print(json.dumps(brief, indent=2))
    return 1 if result["lost"] or result["foreign_errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
