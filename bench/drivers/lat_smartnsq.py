"""smartnsq latency driver (see ``_lat.py``). ``--variant``: ``uvloop`` (uvloop's event
loop), ``blocking`` (``smartnsq.sync.Producer`` and ``smartnsq.sync.Consumer``, iterated:
"handler entry" is the moment the iterator hands the message over), or ``tsleep`` (the
asyncio publisher paced with ``time.sleep``: a diagnostic of the pacing, not a way to use
smartnsq)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _lat

from smartnsq import Consumer, Message, Producer
from smartnsq.sync import Consumer as BlockingConsumer
from smartnsq.sync import Producer as BlockingProducer


def buffer_options(a: argparse.Namespace) -> dict[str, float]:
    return {"output_buffer_timeout": a.obt_ms / 1000} if a.obt_ms else {}


async def send(p: Producer, topic: str, bodies: list[bytes]) -> None:
    if len(bodies) == 1:
        await p.publish(topic, bodies[0])
    else:
        await p.publish_many(topic, bodies)


def send_blocking(p: BlockingProducer, topic: str, bodies: list[bytes]) -> None:
    if len(bodies) == 1:
        p.publish(topic, bodies[0])
    else:
        p.publish_many(topic, bodies)


async def pub_fed(a: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(0, "rb", buffering=0)
    )
    async with Producer(nsqd_tcp_addresses=[a.addr]) as p:
        await p.publish(a.topic, b"W" * 100)  # connected and ready
        feed = _lat.Feed()
        while chunk := await reader.read(1 << 16):
            feed.add(chunk)
            while (bodies := feed.call()) is not None:
                await send(p, a.topic, bodies)
        feed.result()


async def pub(a: argparse.Namespace) -> None:
    if a.feed:
        return await pub_fed(a)
    # "tsleep": wait for each due time with time.sleep (blocking the loop; nothing else runs
    # in this process), whose wake-up is not rounded to a whole millisecond as the loop's is.
    precise = "tsleep" in a.variant.split(",")
    async with Producer(nsqd_tcp_addresses=[a.addr]) as p:
        await p.publish(a.topic, b"W" * 100)  # connected and ready
        pacer = _lat.Pacer(a)
        while (due := pacer.step()) is not None:
            if isinstance(due, float):
                if precise:
                    time.sleep(due)
                else:
                    await asyncio.sleep(due)
            else:
                await send(p, a.topic, due)
        pacer.result()


async def sub(a: argparse.Namespace) -> None:
    rec = _lat.Recorder(a.out)

    async def handler(message: Message) -> None:
        rec.record(message.body)

    async with Consumer(
        a.topic,
        a.channel,
        handler,
        nsqd_tcp_addresses=[a.addr],
        max_in_flight=a.mif,
        **buffer_options(a),  # type: ignore[arg-type]
    ):
        rec.ready()
        await asyncio.Event().wait()


def pub_blocking(a: argparse.Namespace) -> None:
    with BlockingProducer(nsqd_tcp_addresses=[a.addr]) as p:
        p.publish(a.topic, b"W" * 100)
        if a.feed:
            feed = _lat.Feed()
            while chunk := os.read(0, 1 << 16):
                feed.add(chunk)
                while (bodies := feed.call()) is not None:
                    send_blocking(p, a.topic, bodies)
            feed.result()
            return
        pacer = _lat.Pacer(a)
        while (due := pacer.step()) is not None:
            if isinstance(due, float):
                time.sleep(due)
            else:
                send_blocking(p, a.topic, due)
        pacer.result()


def sub_blocking(a: argparse.Namespace) -> None:
    rec = _lat.Recorder(a.out)
    with BlockingConsumer(
        a.topic,
        a.channel,
        nsqd_tcp_addresses=[a.addr],
        max_in_flight=a.mif,
        **buffer_options(a),  # type: ignore[arg-type]
    ) as c:
        rec.ready()
        for message in c:
            rec.record(message.body)
    threading.Event().wait()


def main() -> None:
    a = _lat.parse_args()
    variants = a.variant.split(",")
    if "blocking" in variants:
        (pub_blocking if a.role == "pub" else sub_blocking)(a)
        return
    coro = pub(a) if a.role == "pub" else sub(a)
    if "uvloop" in variants:
        import uvloop

        uvloop.run(coro)
    else:
        asyncio.run(coro)


if __name__ == "__main__":
    main()
