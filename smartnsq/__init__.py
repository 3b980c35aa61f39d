"""smartnsq: an NSQ client for classic nsqd and Youzan's partitioned HA fork."""

import logging

from smartnsq._version import __version__
from smartnsq.connection import Connection, ConnectionConfig, Features
from smartnsq.consumer import Consumer
from smartnsq.message import Message
from smartnsq.observe.stats import (
    ConsumerNodeStats,
    ConsumerStats,
    ProducerNodeStats,
    ProducerStats,
)
from smartnsq.offsets import PartitionOffsets, partition_offsets
from smartnsq.producer import Producer
from smartnsq.protocol.message import PublishResult
from smartnsq.runner import run, serve

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

# A library logs only where the application asked for logs: without this, Python's
# last-resort handler prints our warnings to stderr of programs that configured nothing.
logging.getLogger("smartnsq").addHandler(logging.NullHandler())
