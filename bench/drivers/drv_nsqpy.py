"""nsq-py 0.1.x driver (synchronous sockets): Client.pub / mpub block until
nsqd's reply.  Topic names must be bytes on Python 3.  ``concurrent`` is not
supported (not required for peers).  ``consume``: ``for message in
nsq.reader.Reader(...): message.fin()``; the reader loop keeps running after the
last message so the buffered FINs get flushed."""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _driver as d
from nsq.client import Client
from nsq.reader import Reader
from nsq.response import Error

logging.getLogger("nsq").setLevel(logging.WARNING)


def failed(resps: list[object]) -> str | None:
    bad = [r for r in resps if isinstance(r, Error)]
    return repr(bad) if bad else None


def consume(a: Any) -> None:
    d.exit_on_stdin()
    t_start = d.start()
    reader = Reader(
        a.topic.encode(),
        a.channel.encode(),
        nsqd_tcp_addresses=[a.addr],
        max_in_flight=a.mif,
    )
    d.emit_started(t_start)
    for n, message in enumerate(reader, 1):
        message.fin()
        if n == a.n:
            d.emit_handled(n, t_start)
    while True:
        time.sleep(3600)


def main() -> None:
    a = d.parse_args()
    if a.workload == "concurrent":
        d.unsupported(a.workload)
    if a.workload == "consume":
        consume(a)
        return
    topic = a.topic.encode()
    client = Client(nsqd_tcp_addresses=[a.addr])
    err = failed(client.pub(topic, d.MSG))  # warm-up
    batch = [d.MSG] * a.batch
    n = 0
    t0 = d.start()
    deadline = t0 + a.seconds
    if a.workload == "mpub":
        while n < a.n and not err:
            err = failed(client.mpub(topic, *batch))
            if not err:
                n += a.batch
            if d.now() >= deadline:
                break
    else:
        while n < a.n and not err and d.now() < deadline:
            err = failed(client.pub(topic, d.MSG))
            if not err:
                n += 1
    d.emit(n, 1, t0, d.now(), err)


if __name__ == "__main__":
    main()
