"""pynsq 0.9.x driver (tornado).

pynsq only has a callback API: ``Writer.pub(topic, msg, callback)``; the
callback fires with nsqd's reply.  Sequential workloads issue the next
command from the previous reply's callback.  ``concurrent`` keeps --tasks
PUBs in flight on the writer's single connection, each reply callback
issuing the next PUB (pynsq pipelines naturally).  ``consume``:
``nsq.Reader(message_handler=..., max_in_flight=...)``; returning True FINs.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _driver as d
import nsq
import tornado.ioloop

logging.basicConfig(level=logging.WARNING)


def consume(a: Any) -> None:
    d.exit_on_stdin()
    n = 0

    def handler(message: object) -> bool:
        nonlocal n
        n += 1
        if n == a.n:
            d.emit_handled(n, t_start)
        return True  # -> pynsq sends FIN

    t_start = d.start()
    nsq.Reader(
        topic=a.topic,
        channel=a.channel,
        message_handler=handler,
        nsqd_tcp_addresses=[a.addr],
        max_in_flight=a.mif,
    )
    d.emit_started(t_start)
    tornado.ioloop.IOLoop.current().start()


def main() -> None:
    a = d.parse_args()
    if a.workload == "consume":
        consume(a)
        return
    loop = tornado.ioloop.IOLoop.current()
    writer = nsq.Writer([a.addr])
    step = a.batch if a.workload == "mpub" else 1
    batch = [d.MSG] * a.batch
    st: dict[str, Any] = {"n": 0, "claimed": 0, "inflight": 0, "t0": 0.0}
    st.update(err=None, stopping=False)

    def send() -> None:
        st["claimed"] += step
        st["inflight"] += 1
        if a.workload == "mpub":
            writer.mpub(a.topic, batch, on_resp)
        else:
            writer.pub(a.topic, d.MSG, on_resp)

    def on_resp(conn: object, data: object) -> None:
        st["inflight"] -= 1
        if isinstance(data, nsq.Error):
            st["err"] = st["err"] or str(data)
            st["stopping"] = True
        else:
            st["n"] += step
        if st["claimed"] >= a.n or d.now() - st["t0"] >= a.seconds:
            st["stopping"] = True
        if not st["stopping"]:
            send()
        elif st["inflight"] == 0:
            d.emit(st["n"], 1, st["t0"], d.now(), st["err"])
            loop.stop()

    def on_warmup(conn: object, data: object) -> None:
        if isinstance(data, nsq.Error):
            d.emit(0, 0, 0.0, 1.0, "warm-up: " + str(data))
            loop.stop()
            return
        st["t0"] = d.start()
        for _ in range(a.tasks if a.workload == "concurrent" else 1):
            send()

    def wait_ready() -> None:
        if not writer.conns:
            loop.call_later(0.005, wait_ready)
            return
        writer.pub(a.topic, d.MSG, on_warmup)

    loop.add_callback(wait_ready)
    loop.start()


if __name__ == "__main__":
    main()
