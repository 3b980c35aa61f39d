"""gnsq 1.0.x driver (gevent): Producer.publish / multipublish block until
nsqd's reply.  ``concurrent`` is not supported (not required for peers)."""

from __future__ import annotations

import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _driver as d
import gnsq

logging.basicConfig(level=logging.ERROR)  # close() logs a harmless warning


def main() -> None:
    a = d.parse_args()
    if a.workload == "concurrent":
        d.unsupported(a.workload)
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
