"""gnsq 1.0.x driver (gevent): Producer.publish / multipublish block until
nsqd's reply.  ``concurrent`` is not supported (not required for peers).
``consume``: a ``Consumer.on_message`` handler; returning normally FINs."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _driver as d
import gevent
import gnsq

logging.basicConfig(level=logging.ERROR)  # close() logs a harmless warning


def consume(a: Any) -> None:
    d.exit_on_stdin()
    n = 0
    t_start = d.start()
    consumer = gnsq.Consumer(a.topic, a.channel, [a.addr], max_in_flight=a.mif)

    def handler(consumer: object, message: object) -> None:
        nonlocal n
        n += 1
        if n == a.n:
            d.emit_handled(n, t_start)

    consumer.on_message.connect(handler)

    d.emit_started(t_start)
    consumer.start(block=False)
    while True:
        gevent.sleep(3600)


def main() -> None:
    a = d.parse_args()
    if a.workload == "concurrent":
        d.unsupported(a.workload)
    if a.workload == "consume":
        consume(a)
        return
    producer = gnsq.Producer([a.addr])
    producer.start()
    producer.publish(a.topic, d.MSG)  # warm-up
    batch = [d.MSG] * a.batch
    n, err = 0, None
    t0 = d.start()
    deadline = t0 + a.seconds
    try:
        if a.workload == "mpub":
            while n < a.n:
                producer.multipublish(a.topic, batch)
                n += a.batch
                if d.now() >= deadline:
                    break
        else:
            while n < a.n and d.now() < deadline:
                producer.publish(a.topic, d.MSG)
                n += 1
    except Exception as e:
        err = repr(e)
    d.emit(n, 1, t0, d.now(), err)
    producer.close()
    producer.join()


if __name__ == "__main__":
    main()
