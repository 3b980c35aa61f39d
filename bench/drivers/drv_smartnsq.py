"""smartnsq driver: Producer.publish / publish_many on asyncio."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _driver as d

from smartnsq import Producer


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


def main() -> None:
    asyncio.run(run(d.parse_args()))


if __name__ == "__main__":
    main()
