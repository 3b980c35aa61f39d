"""ansq 0.3.x driver (asyncio): awaited writer.pub / writer.mpub.  ``concurrent``
is not supported (not required for peers).

``consume``: ``async for message in reader.messages(): await message.fin()``.
ansq's Reader only ever sends RDY 1 per connection (``set_max_in_flight()``
raises NotImplementedError), so the public per-connection ``await
conn.rdy(mif)`` is sent after ``create_reader``; ``--variant rdy1`` leaves it
out of the box."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _driver as d
import ansq

logging.basicConfig(level=logging.WARNING)


async def run(a: argparse.Namespace) -> None:
    writer = await ansq.create_writer(nsqd_tcp_addresses=[a.addr])
    r = await writer.pub(a.topic, d.MSG)  # warm-up
    err = None if r.is_response else str(r)
    batch = [d.MSG] * a.batch
    n = 0
    t0 = d.start()
    deadline = t0 + a.seconds
    if a.workload == "mpub":
        while n < a.n and not err:
            r = await writer.mpub(a.topic, *batch)
            if r.is_response:
                n += a.batch
            else:
                err = str(r)
            if d.now() >= deadline:
                break
    else:
        while n < a.n and not err and d.now() < deadline:
            r = await writer.pub(a.topic, d.MSG)
            if r.is_response:
                n += 1
            else:
                err = str(r)
    d.emit(n, 1, t0, d.now(), err)
    await writer.close()


async def consume(a: argparse.Namespace) -> None:
    d.exit_on_stdin()
    t_start = d.start()
    reader = await ansq.create_reader(topic=a.topic, channel=a.channel, nsqd_tcp_addresses=[a.addr])
    if a.variant != "rdy1":
        for conn in reader.connections:
            await conn.rdy(a.mif)
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
