"""A short tour: start a local classic NSQ cluster, publish, consume through lookupd, stop.

Run it with ``./dev demo`` (which sets everything up first). The times it prints are split
by phase: finding the nsqd through lookupd is not consuming, and a deferred message waits
for its delay whatever the client.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compat.cluster import Cluster
from smartnsq import Consumer, Message, Producer

COUNT = 10_000
DELAY = 1.0  # seconds the deferred message waits in nsqd


async def tour(cluster: Cluster) -> None:
    nsqd = [d.tcp for d in cluster.nsqd]
    lookupd = [d.http for d in cluster.lookupd]

    async with Producer(nsqd) as producer:
        started = time.perf_counter()
        await producer.publish("demo", b"hello from smartnsq")
        await producer.publish_many("demo", [b"bulk %d" % i for i in range(COUNT)])
        took = time.perf_counter() - started
        await producer.publish("demo", b"this one waits a second", delay=DELAY)
        deferred_at = time.perf_counter()
        print(f"published {COUNT + 1} messages to {len(nsqd)} nsqd in {took:.3f}s, one deferred")

    arrived: list[float] = []
    bodies: list[bytes] = []
    done = anyio.Event()

    async def handle(message: Message) -> None:
        arrived.append(time.perf_counter())
        bodies.append(message.body)
        if len(bodies) == COUNT + 2:
            done.set()

    started = time.perf_counter()
    async with Consumer(
        "demo", "tour", handle, lookupd_http_addresses=lookupd, max_in_flight=500
    ) as consumer:
        with anyio.fail_after(30):
            await done.wait()
        stats = consumer.stats()
    immediate = [t for t, body in zip(arrived, bodies, strict=True) if body != bodies[-1]]
    first, last = min(immediate), max(immediate)
    rate = len(immediate) / (last - first) if last > first else float("inf")
    print(
        f"discovery: {first - started:.3f}s from creating the Consumer to its first message "
        "(asking lookupd for the topic's nsqd, connecting, subscribing)"
    )
    print(
        f"consuming: {len(immediate)} messages in {last - first:.3f}s from the first to the last "
        f"({rate:,.0f} msg/s; the last partial batch waits for nsqd's output-buffer flush, "
        "250 ms by default: `./dev bench` measures the rate)"
    )
    print(
        f"the deferred message arrived {arrived[-1] - deferred_at:.3f}s after it was published: "
        f"its {DELAY:.0f}s delay, then nsqd's next look at a new channel's deferred messages "
        "(it refreshes that list every 5 s)"
    )
    print(f"received {stats.received}, finished {stats.finished}, over {stats.connections} nsqd")
    print("first:", bodies[0].decode(), "| last:", bodies[-1].decode())


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="smartnsq-demo-") as tmp:
        print("starting a local classic cluster (1 nsqlookupd, 2 nsqd) ...")
        with Cluster.start(kind="classic", dir=Path(tmp), nsqd=2) as cluster:
            print("cluster:", cluster.info)
            anyio.run(tour, cluster)
        print("cluster stopped")


if __name__ == "__main__":
    main()
