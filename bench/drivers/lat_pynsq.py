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


def publish(writer: Any, topic: str, bodies: list[bytes], on_resp: Any) -> None:
    if len(bodies) == 1:
        writer.pub(topic, bodies[0], on_resp)
    else:
        writer.mpub(topic, bodies, on_resp)


def answered(st: dict[str, Any], then: Any) -> Any:
    """The callback for a publish's answer: an error is kept in ``st["err"]``, then
    ``then()``."""

    def on_resp(conn: object, data: object) -> None:
        if isinstance(data, nsq.Error):
            st["err"] = st["err"] or str(data)
        then()

    return on_resp


def when_ready(loop: Any, writer: Any, topic: str, then: Any) -> None:
    """Publish one warm-up message once connected; ``then()`` on its answer."""

    def wait() -> None:
        if not writer.conns:
            loop.call_later(0.005, wait)
            return
        writer.pub(topic, b"W" * 100, lambda conn, data: then())

    loop.add_callback(wait)


def pub_fed(a: Any) -> None:
    loop = tornado.ioloop.IOLoop.current()
    writer = nsq.Writer([a.addr])
    feed = _lat.Feed()
    st: dict[str, Any] = {"busy": True, "eof": False, "err": None}

    def send() -> None:
        bodies = feed.call()
        st["busy"] = bodies is not None
        if bodies is not None:
            publish(writer, a.topic, bodies, on_resp)
        elif st["eof"]:
            feed.result(st["err"])
            loop.stop()

    on_resp = answered(st, send)

    def on_readable(fd: int, events: int) -> None:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            st["eof"] = True
            loop.remove_handler(0)
        feed.add(chunk)
        if not st["busy"]:
            send()

    loop.add_handler(0, on_readable, tornado.ioloop.IOLoop.READ)
    when_ready(loop, writer, a.topic, send)
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
        else:
            publish(writer, a.topic, due, on_resp)

    on_resp = answered(st, tick)

    def start() -> None:
        st["pacer"] = _lat.Pacer(a)
        tick()

    when_ready(loop, writer, a.topic, start)
    loop.start()


def main() -> None:
    a = _lat.parse_args()
    (pub if a.role == "pub" else sub)(a)


if __name__ == "__main__":
    main()
