"""The producer, composed of parts named for their jobs.

- :mod:`~smartnsq.producer.front`: the async front door, :class:`Producer`; it wires the rest.
- :mod:`~smartnsq.producer.settings`: the settings, checked once.
- :mod:`~smartnsq.producer.plan`: what a publish call becomes (sans-IO).
- :mod:`~smartnsq.producer.nodes`: which nsqd takes it, and each nsqd's health (sans-IO).
- :mod:`~smartnsq.producer.links`: connections, lookups and who may publish (async);
  :mod:`~smartnsq.producer.links_sync`: the blocking ones.
- :mod:`~smartnsq.producer.io`: sending, waiting and retrying; the one source of its blocking
  twin :mod:`~smartnsq.producer.io_sync`, which ``scripts/unasync.py`` generates (as it
  generates the blocking front door, :class:`smartnsq.sync.Producer`, from ``front``).
"""

from smartnsq.producer.front import Producer
from smartnsq.producer.plan import emit_publish
from smartnsq.producer.settings import DEFAULT_MAX_BODY_SIZE, DEFAULT_MAX_MESSAGE_SIZE

__all__ = ["DEFAULT_MAX_BODY_SIZE", "DEFAULT_MAX_MESSAGE_SIZE", "Producer", "emit_publish"]
