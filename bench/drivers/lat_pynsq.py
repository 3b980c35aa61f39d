"""pynsq 0.9.x latency driver (see ``_lat.py``): ``nsq.Writer`` paced from tornado's
``call_later``, one PUB/MPUB in flight; ``nsq.Reader`` with ``output_buffer_timeout`` (ms)."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _lat
import nsq
import tornado.ioloop

logging.basicConfig(level=logging.WARNING)


def sub(a: Any) -> None:
    rec = _lat.Recorder(a.out)

    def handler(message: Any) -> bool:
        rec.record(message.body)
        return True

    opts = {"output_buffer_timeout": a.obt_ms} if a.obt_ms else {}
    nsq.Reader(
        topic=a.topic,
        channel=a.channel,
        message_handler=handler,
        nsqd_tcp_addresses=[a.addr],
        max_in_flight=a.mif,
        **opts,
    )
    rec.ready()
    tornado.ioloop.IOLoop.current().start()


def pub_fed(a: Any) -> None:
    loop = tornado.ioloop.IOLoop.current()
    writer = nsq.Writer([a.addr])
    feed = _lat.Feed()
    st: dict[str, Any] = {"busy": True, "eof": False, "err": None}

    def send() -> None:
        bodies = feed.call()
        st["busy"] = bodies is not None
        if bodies is None:
            if st["eof"]:
                feed.result(st["err"])
                loop.stop()
        elif len(bodies) == 1:
            writer.pub(a.topic, bodies[0], on_resp)
        else:
            writer.mpub(a.topic, bodies, on_resp)

    def on_resp(conn: object, data: object) -> None:
        if isinstance(data, nsq.Error):
            st["err"] = st["err"] or str(data)
        send()

    def on_readable(fd: int, events: int) -> None:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            st["eof"] = True
            loop.remove_handler(0)
        feed.add(chunk)
        if not st["busy"]:
            send()

    def wait_ready() -> None:
        if not writer.conns:
            loop.call_later(0.005, wait_ready)
            return
        writer.pub(a.topic, b"W" * 100, on_resp)

    loop.add_handler(0, on_readable, tornado.ioloop.IOLoop.READ)
    loop.add_callback(wait_ready)
    loop.start()


def pub(a: Any) -> None:
    if a.feed:
        pub_fed(a)
        return
    loop = tornado.ioloop.IOLoop.current()
    writer = nsq.Writer([a.addr])
    st: dict[str, Any] = {"pacer": None, "err": None}

    def tick() -> None:
        due = st["pacer"].step()
        if due is None:
            st["pacer"].result(st["err"])
            loop.stop()
        elif isinstance(due, float):
            loop.call_later(due, tick)
        elif len(due) == 1:
            writer.pub(a.topic, due[0], on_resp)
        else:
            writer.mpub(a.topic, due, on_resp)

    def on_resp(conn: object, data: object) -> None:
        if isinstance(data, nsq.Error):
            st["err"] = st["err"] or str(data)
        tick()

    def on_warmup(conn: object, data: object) -> None:
        st["pacer"] = _lat.Pacer(a)
        tick()

    def wait_ready() -> None:
        if not writer.conns:
            loop.call_later(0.005, wait_ready)
            return
        writer.pub(a.topic, b"W" * 100, on_warmup)

    loop.add_callback(wait_ready)
    loop.start()


def main() -> None:
    a = _lat.parse_args()
    (pub if a.role == "pub" else sub)(a)


if __name__ == "__main__":
    main()
