"""Blocking front doors for code that is not async (threads, scripts, WSGI, Spark tasks).

:class:`Producer` publishes with blocking sockets on the same sans-IO core as the async
:class:`smartnsq.Producer`; it is thread-safe.
"""

from smartnsq.sync.producer import Producer

__all__ = ["Producer"]
