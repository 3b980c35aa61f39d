"""Consuming: :class:`Consumer`, built from small parts (see :mod:`.front`)."""

from smartnsq.consumer.front import Consumer
from smartnsq.consumer.intake import RawSink, ReadSink, Sink
from smartnsq.consumer.options import Handler, Options, is_async_handler
from smartnsq.consumer.sinks import Sinks
from smartnsq.consumer.subscription import IdAnswerer, Subscription

__all__ = [
    "Consumer",
    "Handler",
    "IdAnswerer",
    "Options",
    "RawSink",
    "ReadSink",
    "Sink",
    "Sinks",
    "Subscription",
    "is_async_handler",
]
