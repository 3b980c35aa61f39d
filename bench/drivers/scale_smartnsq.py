"""smartnsq scale driver: one process, --topics Consumers (lookupd discovery) and one Producer.

    scale_smartnsq.py --lookupd HOST:PORT --nsqd A,B --topics N --rate R [--variant uvloop]
                      [--concurrency K]

Prints ``STARTING {t}`` (CLOCK_MONOTONIC) just before it creates the first consumer and
``SUBSCRIBED {t, connections}`` once every consumer has a connection to every nsqd. Then it
reads commands from stdin: ``load`` starts publishing R messages a second to every topic
(every 0.1 s one ``publish_many`` of R/10 bodies per topic, all topics concurrently, on one
Producer that round-robins over the nsqd), ``count`` prints ``COUNT {published, handled}``,
and ``stop`` (or end of input) exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from contextlib import AsyncExitStack

from smartnsq import Consumer, Message, Producer

BODY = b"x" * 100


def emit(kind: str, data: dict[str, object]) -> None:
    sys.stdout.write(f"{kind} {json.dumps(data)}\n")
    sys.stdout.flush()


async def main(a: argparse.Namespace) -> None:
    nsqd = a.nsqd.split(",")
    topics = [f"{a.prefix}_{i:04d}" for i in range(a.topics)]
    handled = 0
    published = 0

    async def handler(message: Message) -> None:
        nonlocal handled
        handled += 1

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    async with AsyncExitStack() as stack:
        emit("STARTING", {"t": time.monotonic()})
        consumers = [
            await stack.enter_async_context(
                Consumer(
                    t,
                    "c",
                    handler,
                    lookupd_http_addresses=[a.lookupd],
                    max_in_flight=200,
                    concurrency=a.concurrency,
                )
            )
            for t in topics
        ]
        # Poll only the consumers not yet subscribed, and back off with the poll's own cost:
        # polling all 1,000 every 10 ms kept the loop busy enough for handshakes to time out.
        pending = consumers
        while pending:
            began = time.perf_counter()
            pending = [c for c in pending if c.stats().connections < len(nsqd)]
            await asyncio.sleep(max(0.01, 4 * (time.perf_counter() - began)))
        emit(
            "SUBSCRIBED",
            {"t": time.monotonic(), "connections": sum(c.stats().connections for c in consumers)},
        )
        producer = await stack.enter_async_context(Producer(nsqd_tcp_addresses=nsqd))
        batch = [BODY] * max(1, int(a.rate / 10))
        load: asyncio.Task[None] | None = None

        async def publish_loop() -> None:
            nonlocal published
            tick = time.monotonic()
            while True:
                await asyncio.gather(*(producer.publish_many(t, batch) for t in topics))
                published += len(batch) * len(topics)
                tick += 0.1
                await asyncio.sleep(max(0.0, tick - time.monotonic()))

        while line := (await reader.readline()).decode().strip():
            if line == "load" and load is None:
                load = asyncio.create_task(publish_loop())
            elif line == "count":
                emit("COUNT", {"published": published, "handled": handled})
            elif line == "stop":
                break
        if load is not None:
            load.cancel()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--lookupd", required=True)
    ap.add_argument("--nsqd", required=True)
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--prefix", default="scale", help="topics are PREFIX_0000, PREFIX_0001, ...")
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--variant", default="")
    ap.add_argument("--concurrency", type=int, default=None, help="None: the default")
    args = ap.parse_args()
    if "uvloop" in args.variant:
        import uvloop

        uvloop.run(main(args))
    else:
        asyncio.run(main(args))
