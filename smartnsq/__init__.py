"""smartnsq: an NSQ client for classic nsqd and Youzan's partitioned HA fork."""

import logging
from importlib import import_module
from typing import TYPE_CHECKING, Any

from smartnsq._version import __version__

if TYPE_CHECKING:
    from smartnsq.consumer import Consumer
    from smartnsq.consumer.message import Message
    from smartnsq.net.connection import Connection, ConnectionConfig, Features
    from smartnsq.offsets import PartitionOffsets, partition_offsets
    from smartnsq.producer import Producer
    from smartnsq.protocol.message import PublishResult
    from smartnsq.runner import run, serve
    from smartnsq.stats import (
        ConsumerNodeStats,
        ConsumerStats,
        ProducerNodeStats,
        ProducerStats,
    )

__all__ = [
    "Connection",
    "ConnectionConfig",
    "Consumer",
    "ConsumerNodeStats",
    "ConsumerStats",
    "Features",
    "Message",
    "PartitionOffsets",
    "Producer",
    "ProducerNodeStats",
    "ProducerStats",
    "PublishResult",
    "__version__",
    "partition_offsets",
    "run",
    "serve",
]

# The names above are imported on first use, from these modules: `import smartnsq` alone (say,
# by the pytest plugin that pytest loads in every run, or to read __version__) stays cheap.
_LAZY = {
    "Connection": "smartnsq.net.connection",
    "ConnectionConfig": "smartnsq.net.connection",
    "Features": "smartnsq.net.connection",
    "Consumer": "smartnsq.consumer",
    "ConsumerNodeStats": "smartnsq.stats",
    "ConsumerStats": "smartnsq.stats",
    "Message": "smartnsq.consumer.message",
    "PartitionOffsets": "smartnsq.offsets",
    "Producer": "smartnsq.producer",
    "ProducerNodeStats": "smartnsq.stats",
    "ProducerStats": "smartnsq.stats",
    "PublishResult": "smartnsq.protocol.message",
    "partition_offsets": "smartnsq.offsets",
    "run": "smartnsq.runner",
    "serve": "smartnsq.runner",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'smartnsq' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups do not come back here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


# A library logs only where the application asked for logs: without this, Python's
# last-resort handler prints our warnings to stderr of programs that configured nothing.
logging.getLogger("smartnsq").addHandler(logging.NullHandler())
