"""Blocking front doors for code that is not async (threads, scripts, WSGI, Spark tasks).

:class:`Producer` publishes with blocking sockets on the same sans-IO core as the async
:class:`smartnsq.Producer`; it is thread-safe. :class:`Consumer` runs the async consumer on a
background event loop and hands messages to your thread.
"""

from smartnsq.offsets import PartitionOffsets
from smartnsq.sync.consumer import Consumer
from smartnsq.sync.offsets import partition_offsets
from smartnsq.sync.producer import Producer

__all__ = ["Consumer", "PartitionOffsets", "Producer", "partition_offsets"]
