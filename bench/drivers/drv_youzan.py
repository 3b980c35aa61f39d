"""smartnsq driver for the Youzan HA cluster benchmark (``python -m bench.youzan``).

    drv_youzan.py WORKLOAD --lookupd HOST:PORT --topic T [--keys K] [--n N]
                  [--seconds S] [--tasks T] [--batch B] [--partitions P] [--channel C] [--mif M]

Everything goes through nsqlookupd (``lookupd_http_addresses``).  With ``--keys
K`` > 0 every publish carries a sharding key out of ``key-0`` .. ``key-{K-1}``
(round-robin); with ``--keys 0`` there is none and the producer spreads the
messages over the partitions round-robin.

WORKLOAD is one of
  pub         sequential ``publish()``, one in flight
  concurrent  --tasks tasks calling ``publish()`` on one producer; task j owns
              the keys j, j + tasks, j + 2 * tasks, ... (pipelined)
  mpub        ``publish_many()`` batches of --batch, one batch in flight, one key a batch
  fill        (untimed set-up) --n messages in ``publish_many()`` batches of --batch
  consume     ``Consumer(..., max_in_flight=--mif)`` with an ``async def`` handler that
              counts, until --n distinct messages were handled (on ordered
              subscriptions a message whose offset is not above the last one of
              its partition is a redelivery and not counted again)

Publish workloads first send one untimed message to every partition (so every
partition leader is connected), then stop after --n messages or --seconds.
Every workload prints one line ``RESULT {json}`` with n, warmup, elapsed
(seconds), rate (messages per second) and cpu (this process's CPU seconds
during the timed part); ``consume`` adds handled (handler calls, redeliveries
included) and, on ordered subscriptions, rtt_us: the median per-partition round
trip (time between two handler calls on one partition, median per partition,
then the median of those) and rtt_us_per_partition.  ``consume`` is timed from
just before the Consumer is created to the handler call that sees the --n-th
distinct message; it then lets the loop run 0.5 s more so the last FINs are
written, and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import time
from typing import Any

from smartnsq import Consumer, Message, Producer

MSG = b"x" * 100


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("workload", choices=("pub", "concurrent", "mpub", "fill", "consume"))
    p.add_argument("--lookupd", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--keys", type=int, default=200)
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--tasks", type=int, default=64)
    p.add_argument("--batch", type=int, default=200)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--channel", default="ch")
    p.add_argument("--mif", type=int, default=16)
    return p.parse_args(argv)


def emit(n: int, warmup: int, elapsed: float, cpu: float, error: str | None, **extra: Any) -> None:
    d = {
        "n": n,
        "warmup": warmup,
        "elapsed": elapsed,
        "rate": n / elapsed if elapsed > 0 else 0.0,
        "cpu": cpu,
        "error": error,
        **extra,
    }
    sys.stdout.write("RESULT " + json.dumps(d) + "\n")
    sys.stdout.flush()


async def publish(a: argparse.Namespace) -> None:
    keys: list[str | None] = [f"key-{i}" for i in range(a.keys)] or [None]
    async with Producer(lookupd_http_addresses=[a.lookupd]) as p:
        warmup = 0
        if a.workload != "fill":
            for part in range(a.partitions):
                await p.publish(a.topic, MSG, partition=part)
                warmup += 1
        n, err = 0, None
        cpu0, t0 = time.process_time(), time.monotonic()
        deadline = t0 + (a.seconds if a.workload != "fill" else 3600.0)
        try:
            if a.workload == "pub":
                while n < a.n and time.monotonic() < deadline:
                    await p.publish(a.topic, MSG, sharding_key=keys[n % len(keys)])
                    n += 1
            elif a.workload in ("mpub", "fill"):
                batch = [MSG] * a.batch
                i = 0
                while n < a.n and time.monotonic() < deadline:
                    size = min(a.batch, a.n - n)
                    body = batch if size == a.batch else batch[:size]
                    await p.publish_many(a.topic, body, sharding_key=keys[i % len(keys)])
                    n += size
                    i += 1
            else:
                n = await concurrent(p, a, keys, deadline)
        except Exception as e:
            err = repr(e)
        elapsed, cpu = time.monotonic() - t0, time.process_time() - cpu0
    emit(n, warmup, elapsed, cpu, err)


async def concurrent(
    p: Producer, a: argparse.Namespace, keys: list[str | None], deadline: float
) -> int:
    claimed = 0
    done = 0

    async def worker(j: int) -> None:
        nonlocal claimed, done
        mine = keys[j :: a.tasks] or [keys[j % len(keys)]]
        i = 0
        while claimed < a.n:
            claimed += 1
            await p.publish(a.topic, MSG, sharding_key=mine[i % len(mine)])
            i += 1
            done += 1
            if time.monotonic() >= deadline:
                claimed = a.n  # stop every worker

    async with asyncio.TaskGroup() as tg:
        for j in range(a.tasks):
            tg.create_task(worker(j))
    return done


async def consume(a: argparse.Namespace) -> None:
    last: dict[int | None, int] = {}  # partition -> highest offset seen (ordered only)
    distinct = handled = 0
    done = asyncio.Event()
    t_end = 0.0
    cpu_end = 0.0

    arrivals: dict[int | None, list[float]] = {}  # partition -> handler call times

    async def handler(message: Message) -> None:
        nonlocal distinct, handled, t_end, cpu_end
        handled += 1
        off = message.offset  # set on ordered subscriptions: a redelivery repeats one
        if off is not None:
            part = message.partition
            arrivals.setdefault(part, []).append(time.perf_counter())
            if off <= last.get(part, -1):
                return
            last[part] = off
        distinct += 1
        if distinct == a.n:
            t_end, cpu_end = time.monotonic(), time.process_time()
            done.set()

    err = None
    cpu0, t0 = time.process_time(), time.monotonic()
    try:
        async with Consumer(
            a.topic, a.channel, handler, lookupd_http_addresses=[a.lookupd], max_in_flight=a.mif
        ):
            await asyncio.wait_for(done.wait(), timeout=a.seconds)
            await asyncio.sleep(0.5)  # untimed: let the last FINs go out
    except Exception as e:
        err = repr(e)
        t_end, cpu_end = time.monotonic(), time.process_time()
    emit(distinct, 0, t_end - t0, cpu_end - cpu0, err, handled=handled, **round_trips(arrivals))


def round_trips(arrivals: dict[int | None, list[float]]) -> dict[str, Any]:
    """An ordered partition has one message in flight: the time between two handler calls
    on it is its round trip (FIN out, next message in, handed over). Median per partition,
    in microseconds; ``rtt_us`` is the median of those."""
    per = []
    for times in arrivals.values():
        gaps = sorted(b - a for a, b in itertools.pairwise(times))
        if gaps:
            per.append(round(gaps[len(gaps) // 2] * 1e6, 1))
    if not per:
        return {}
    return {"rtt_us": statistics.median(per), "rtt_us_per_partition": sorted(per)}


def main() -> None:
    a = parse_args()
    asyncio.run(consume(a) if a.workload == "consume" else publish(a))


if __name__ == "__main__":
    main()
