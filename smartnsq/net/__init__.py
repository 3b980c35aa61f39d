"""Bytes and waits on anyio, below the front doors and above :mod:`smartnsq.protocol`.

- :mod:`~smartnsq.net.transport`: the byte transports; :mod:`~smartnsq.net.dial` connects
  and shakes hands.
- :mod:`~smartnsq.net.connection`: one async nsqd connection; :mod:`~smartnsq.net.frame_pump`
  is its read side, :mod:`~smartnsq.net.waiters` its requests waiting for answers.
- :mod:`~smartnsq.net.blocking`: the blocking connection (the blocking Producer, Spark).
- :mod:`~smartnsq.net.http`: HTTP requests to nsqd and nsqlookupd.
- Waiting cheaply: :mod:`~smartnsq.net.busy_poll`, :mod:`~smartnsq.net.wakeup`,
  :mod:`~smartnsq.net.inbox` (other threads to the loop), :mod:`~smartnsq.net.idle` (idle
  workers) and
  :mod:`~smartnsq.net.eager` (the one guarded home of CPython's private asyncio internals).
"""
