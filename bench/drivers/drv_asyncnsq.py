"""asyncnsq 1.2.x driver (asyncio): awaited writer.pub / writer.mpub.
(asyncnsq 2.x needs Python >= 3.12 and is not run.)  ``concurrent`` is not
supported (not required for peers).  ``consume``: the documented 1.x API,
``async for message in reader.messages(): await message.fin()``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _driver as d
import asyncnsq

logging.basicConfig(level=logging.WARNING)


def ok(r: object) -> bool:
    return r in (b"OK", "OK")


async def run(a: argparse.Namespace) -> None:
    writer = await asyncnsq.create_writer(host=a.host, port=a.port)
    r = await writer.pub(a.topic, d.MSG)  # warm-up
    err = None if ok(r) else repr(r)
    batch = [d.MSG] * a.batch
    n = 0
    t0 = d.start()
    deadline = t0 + a.seconds
    if a.workload == "mpub":
        while n < a.n and not err:
            r = await writer.mpub(a.topic, *batch)
            if ok(r):
                n += a.batch
            else:
                err = repr(r)
            if d.now() >= deadline:
                break
    else:
        while n < a.n and not err and d.now() < deadline:
            r = await writer.pub(a.topic, d.MSG)
            if ok(r):
                n += 1
            else:
                err = repr(r)
    d.emit(n, 1, t0, d.now(), err)
    writer.close()


async def consume(a: argparse.Namespace) -> None:
    d.exit_on_stdin()
    t_start = d.start()
    reader = await asyncnsq.create_reader(nsqd_tcp_addresses=[a.addr], max_in_flight=a.mif)
    await reader.subscribe(a.topic, a.channel)
    d.emit_started(t_start)
    n = 0
    async for message in reader.messages():
        await message.fin()
        n += 1
        if n == a.n:
            d.emit_handled(n, t_start)
    await asyncio.sleep(3600)


def main() -> None:
    a = d.parse_args()
    if a.workload == "concurrent":
        d.unsupported(a.workload)
    asyncio.run(consume(a) if a.workload == "consume" else run(a))


if __name__ == "__main__":
    main()
