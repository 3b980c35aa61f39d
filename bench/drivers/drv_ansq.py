"""ansq 0.3.x driver (asyncio): awaited writer.pub / writer.mpub.  ``concurrent``
is not supported (not required for peers)."""

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


def main() -> None:
    a = d.parse_args()
    if a.workload == "concurrent":
        d.unsupported(a.workload)
    asyncio.run(run(a))


if __name__ == "__main__":
    main()
