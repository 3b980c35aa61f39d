"""smartnsq driver: Producer.publish / publish_many; Consumer with a handler for
``consume``.  ``--variant`` is a comma-separated list of: ``sync`` (consume
with a plain ``def`` handler instead of an ``async def`` one), ``uvloop`` (run
on uvloop's event loop instead of asyncio's), ``blocking`` (publish with the
blocking ``smartnsq.sync.Producer``, no event loop).  Returning normally FINs."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _driver as d

from smartnsq import Consumer, Message, Producer
from smartnsq.sync import Producer as BlockingProducer


def run_blocking(a: argparse.Namespace) -> None:
    with BlockingProducer(nsqd_tcp_addresses=[a.addr]) as p:
        p.publish(a.topic, d.MSG)  # warm-up: connection is up and ready
        n, err = 0, None
        t0 = d.start()
        deadline = t0 + a.seconds
        try:
            if a.workload == "pub":
                while n < a.n and d.now() < deadline:
                    p.publish(a.topic, d.MSG)
                    n += 1
            else:
                batch = [d.MSG] * a.batch
                while n < a.n:
                    p.publish_many(a.topic, batch)
                    n += a.batch
                    if d.now() >= deadline:
                        break
        except Exception as e:
            err = repr(e)
        t1 = d.now()
    d.emit(n, 1, t0, t1, err)


async def run(a: argparse.Namespace) -> None:
    async with Producer(nsqd_tcp_addresses=[a.addr]) as p:
        await p.publish(a.topic, d.MSG)  # warm-up: connection is up and ready
        n, err = 0, None
        t0 = d.start()
        deadline = t0 + a.seconds
        try:
            if a.workload == "pub":
                while n < a.n and d.now() < deadline:
                    await p.publish(a.topic, d.MSG)
                    n += 1
            elif a.workload == "mpub":
                batch = [d.MSG] * a.batch
                while n < a.n:
                    await p.publish_many(a.topic, batch)
                    n += a.batch
                    if d.now() >= deadline:
                        break
            else:
                n = await concurrent(p, a, deadline)
        except Exception as e:
            err = repr(e)
        t1 = d.now()
    d.emit(n, 1, t0, t1, err)


async def concurrent(p: Producer, a: argparse.Namespace, deadline: float) -> int:
    claimed = 0
    done = 0

    async def worker() -> None:
        nonlocal claimed, done
        while claimed < a.n:
            claimed += 1
            await p.publish(a.topic, d.MSG)
            done += 1
            if d.now() >= deadline:
                claimed = a.n  # stop every worker

    async with asyncio.TaskGroup() as tg:
        for _ in range(a.tasks):
            tg.create_task(worker())
    return done


async def consume(a: argparse.Namespace) -> None:
    d.exit_on_stdin()
    count = 0
    done = asyncio.Event()

    async def async_handler(message: Message) -> None:
        nonlocal count
        count += 1
        if count == a.n:
            d.emit_handled(count, t_start)
            done.set()

    def sync_handler(message: Message) -> None:
        nonlocal count
        count += 1
        if count == a.n:
            d.emit_handled(count, t_start)
            done.set()

    handler = sync_handler if "sync" in a.variant.split(",") else async_handler
    t_start = d.start()
    async with Consumer(
        a.topic, a.channel, handler, nsqd_tcp_addresses=[a.addr], max_in_flight=a.mif
    ):
        d.emit_started(t_start)
        await done.wait()
        # keep the loop running so the last FINs are flushed; the runner ends us
        await asyncio.sleep(3600)


def main() -> None:
    a = d.parse_args()
    if "blocking" in a.variant.split(","):
        run_blocking(a)
        return
    main = consume(a) if a.workload == "consume" else run(a)
    if "uvloop" in a.variant.split(","):
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)


if __name__ == "__main__":
    main()
