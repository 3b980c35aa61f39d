"""smartnsq: an NSQ client for classic nsqd and Youzan's partitioned HA fork."""

from smartnsq._version import __version__
from smartnsq.connection import Connection, ConnectionConfig, Features
from smartnsq.producer import Producer
from smartnsq.protocol.message import PublishResult

__all__ = [
    "Connection",
    "ConnectionConfig",
    "Features",
    "Producer",
    "PublishResult",
    "__version__",
]
