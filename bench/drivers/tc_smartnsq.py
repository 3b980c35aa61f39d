"""smartnsq driver for the TLS and compression benchmark.

    tc_smartnsq.py tpub --addr A --topic T [--seconds 5] [--batch 200] [--tls CAFILE]
                        [--snappy] [--deflate] [--variant uvloop|blocking]
    tc_smartnsq.py tsub --addr A --topic T --channel C --n N [--mif 2500] [...]

``tpub``: ``publish_many`` of --batch 100-byte bodies, one batch in flight, for --seconds
after one warm-up PUB. ``tsub``: an ``async def`` handler over N pre-filled messages, timed
from just before the Consumer is created to the N-th handler call. Both print ``RESULT
{json}`` (n, elapsed, rate, cpu: this process's CPU seconds over the timed part).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
import time
from typing import Any

from smartnsq import Consumer, Message, Producer
from smartnsq.sync import Producer as BlockingProducer

BODY = b"x" * 100


def result(n: int, t0: float, c0: float) -> None:
    el = time.monotonic() - t0
    cpu = time.process_time() - c0
    sys.stdout.write("RESULT " + json.dumps({"n": n, "elapsed": el, "rate": n / el, "cpu": cpu}))
    sys.stdout.write("\n")
    sys.stdout.flush()


def options(a: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {"snappy": a.snappy, "deflate": a.deflate}
    if a.tls:
        opts["tls"] = ssl.create_default_context(cafile=a.tls)
    return opts


async def tpub(a: argparse.Namespace) -> None:
    async with Producer(nsqd_tcp_addresses=[a.addr], **options(a)) as p:
        await p.publish(a.topic, BODY)
        batch = [BODY] * a.batch
        n, t0, c0 = 0, time.monotonic(), time.process_time()
        while time.monotonic() - t0 < a.seconds:
            await p.publish_many(a.topic, batch)
            n += a.batch
        result(n, t0, c0)


def tpub_blocking(a: argparse.Namespace) -> None:
    with BlockingProducer(nsqd_tcp_addresses=[a.addr], **options(a)) as p:
        p.publish(a.topic, BODY)
        batch = [BODY] * a.batch
        n, t0, c0 = 0, time.monotonic(), time.process_time()
        while time.monotonic() - t0 < a.seconds:
            p.publish_many(a.topic, batch)
            n += a.batch
        result(n, t0, c0)


async def tsub(a: argparse.Namespace) -> None:
    done = asyncio.Event()
    count = 0

    async def handler(message: Message) -> None:
        nonlocal count
        count += 1
        if count == a.n:
            result(count, t0, c0)
            done.set()

    t0, c0 = time.monotonic(), time.process_time()
    async with Consumer(
        a.topic, a.channel, handler, nsqd_tcp_addresses=[a.addr], max_in_flight=a.mif, **options(a)
    ):
        await done.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=("tpub", "tsub"))
    ap.add_argument("--addr", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--channel", default="tc")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--mif", type=int, default=2500)
    ap.add_argument("--tls", default="", help="CA file: TLS, certificate checked against it")
    ap.add_argument("--snappy", action="store_true")
    ap.add_argument("--deflate", action="store_true")
    ap.add_argument("--variant", default="")
    a = ap.parse_args()
    if a.variant == "blocking":
        if a.role != "tpub":
            raise SystemExit("blocking: tpub only")
        tpub_blocking(a)
        return
    coro = tpub(a) if a.role == "tpub" else tsub(a)
    if a.variant == "uvloop":
        import uvloop

        uvloop.run(coro)
    else:
        asyncio.run(coro)


if __name__ == "__main__":
    main()
