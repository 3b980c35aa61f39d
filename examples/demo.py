"""A short tour: start a local classic NSQ cluster, publish, consume through lookupd, stop.

Run it with ``./dev demo`` (which sets everything up first).
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


async def tour(cluster: Cluster) -> None:
    nsqd = [d.tcp for d in cluster.nsqd]
    lookupd = [d.http for d in cluster.lookupd]

    async with Producer(nsqd) as producer:
        started = time.perf_counter()
        await producer.publish("demo", b"hello from smartnsq")
        await producer.publish("demo", b"this one waits a second", delay=1.0)
        await producer.publish_many("demo", [b"bulk %d" % i for i in range(COUNT)])
        took = time.perf_counter() - started
        print(f"published {COUNT + 2} messages to {len(nsqd)} nsqd in {took:.3f}s")

    seen: list[bytes] = []
    done = anyio.Event()

    async def handle(message: Message) -> None:
        seen.append(message.body)
        if len(seen) == COUNT + 2:
            done.set()

    started = time.perf_counter()
    async with Consumer(
        "demo", "tour", handle, lookupd_http_addresses=lookupd, max_in_flight=500
    ) as consumer:
        with anyio.fail_after(30):
            await done.wait()
        took = time.perf_counter() - started
        print(f"consumed {len(seen)} messages via lookupd in {took:.3f}s: {consumer.stats()}")
    print("first:", seen[0].decode(), "| last:", seen[-1].decode())


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
