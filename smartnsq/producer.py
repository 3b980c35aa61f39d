"""The publishing front door: :class:`Producer` (async).

Publishing, sending and retrying are :class:`~smartnsq.publish_io.AsyncPublisher`'s (the one
source the blocking :class:`smartnsq.sync.Producer`'s code is generated from); settings,
planning, routing and node health are :class:`~smartnsq.publishing.ProducerCore`'s. This
module holds what only the async producer does: the event loop it belongs to, the task group
its connections run in, opening a connection and asking lookupd.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import anyio
import anyio.abc

from smartnsq._checks import FORKS, owner, wrong_owner
from smartnsq.connection import Connection
from smartnsq.errors import NSQError, NSQTimeout
from smartnsq.lookup.model import TopicLayout
from smartnsq.publish_io import AsyncPublisher
from smartnsq.publishing import (
    DEFAULT_MAX_BODY_SIZE,
    DEFAULT_MAX_MESSAGE_SIZE,
    Node,
    emit_publish,
)

__all__ = ["DEFAULT_MAX_BODY_SIZE", "DEFAULT_MAX_MESSAGE_SIZE", "Producer", "emit_publish"]


_Node = Node[Connection, anyio.Lock]


class Producer(AsyncPublisher[_Node]):
    """Publishes messages to one or more nsqd.

    Use it as an async context manager:

        async with Producer(nsqd_tcp_addresses=["127.0.0.1:4150"]) as producer:
            await producer.publish("events", b"hello")

    Each call returns once nsqd has acknowledged the message, or raises. Requests are
    pipelined: many tasks may publish at once over the same connection. On a connection
    failure before the message was sent, or a server error that is safe to retry, the request
    is retried (on another nsqd when there is one) until ``max_retries`` or the call's
    ``timeout`` runs out. A message that was sent is never sent again: when its answer does
    not come in time ([`NSQTimeout`][smartnsq.errors.NSQTimeout]) or its connection ends first
    ([`OutcomeUnknown`][smartnsq.errors.OutcomeUnknown]), the call raises: it may or may not
    have been published.
    An nsqd that cannot be reached, does not speak NSQ or lets a publish time out is avoided
    for a while (growing with each failure), then tried again by one request at a time.

    Entering it connects to the configured nsqd (``nsqd_tcp_addresses``) until one
    answers: settings nsqd refuses raise [`ConfigRefused`][smartnsq.errors.ConfigRefused]
    there (and from a publish that opens a connection), not retried. An nsqd that cannot be
    reached does not fail the start.

    A Producer belongs to the event loop (thread) and process that entered it: used from
    another thread it raises [`WrongEventLoop`][smartnsq.errors.WrongEventLoop], in a child
    after ``fork()`` [`UsedAfterFork`][smartnsq.errors.UsedAfterFork]. For plain threads use
    [`smartnsq.sync.Producer`][smartnsq.sync.Producer].
    """

    def _setup(self) -> None:
        self._thread = None  # owner thread and fork generation, set on entry
        self._forks = FORKS[0]
        self._open = False  # until entered
        self._tg: anyio.abc.TaskGroup | None = None

    def _new_node(self, address: str) -> _Node:
        return Node(address, anyio.Lock())

    # -- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> Producer:
        if self._tg is not None or self._closed:
            raise NSQError("a Producer can be entered only once")
        self._thread, self._forks = owner()
        if self._lookup is not None:
            await self._lookup.__aenter__()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._open = True
        try:
            await self._check_settings()
        except BaseException:  # refused, or cancelled: leave nothing open (its task group)
            await self.close()  # shields what must finish; exits the task group entered above
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, timeout: float = 5.0) -> None:
        """Wait for outstanding answers (briefly), then close every connection.

        ``async with`` calls it on exit; calling it again does nothing.

        Args:
            timeout: Seconds each connection waits for its outstanding answers, default
                5.0; 0 closes at once (a publish still waiting then raises).
        """
        if self._closed:
            return
        self._closed = True
        self._open = False
        with anyio.CancelScope(shield=True):
            for node in self._by_address.values():
                for conn in list(node.connections):
                    await conn.close(timeout)
            if self._lookup is not None:
                await self._lookup.__aexit__(None, None, None)
        if self._tg is not None:
            self._tg.cancel_scope.cancel()
            await self._tg.__aexit__(None, None, None)

    # -- the publisher's hooks -------------------------------------------------------------------

    def _check_usable(self) -> None:
        wrong_owner("Producer", self._thread, self._forks)

    def _not_open(self) -> NSQError:
        return NSQError("use the Producer inside 'async with Producer(...)' (or it is closed)")

    def _bound(self, limit: float) -> AbstractContextManager[object]:
        # A request past the deadline raises NSQTimeout itself (and so names its connection);
        # this outer bound covers connecting and lookups.
        return anyio.fail_after(limit + 0.2)

    async def _refresh(self, topic: str, deadline: float, everywhere: bool = False) -> TopicLayout:
        assert self._lookup is not None
        try:
            with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
                if everywhere:
                    return await self._lookup.every_nsqd(topic)
                return await self._lookup.refresh(topic, "w")
        except TimeoutError:
            raise NSQTimeout(f"lookup of {topic!r} did not finish in time") from None

    async def _node_connection(self, node: _Node, deadline: float) -> Connection:
        # The deadline is _bound's: its cancel scope covers the wait for the lock and opening.
        conn = node.reusable(self._per_node)
        if conn is not None:
            return conn
        async with node.lock:
            conn = node.reusable(self._per_node)
            if conn is not None:
                return conn
            with self._opening(node):
                conn = await Connection.open(node.address, self._config)
            # Not marked up yet: only an answered request shows the node works.
            self._connected(node)
            conn.on_close = lambda c: self._forget(node, c)
            node.add(conn)
            assert self._tg is not None
            self._tg.start_soon(conn.run)
            return conn

    def _discard(self, node: _Node, conn: Connection, close: bool, exc: Exception) -> None:
        # A lost connection forgets itself (on_close); one to close is closed in the background.
        if close and self._tg is not None:
            # Its other requests may still be answered: they get the Producer's timeout.
            self._tg.start_soon(conn.close, self.timeout)

    def _suspect(self, node: _Node, conn: Connection) -> None:
        self._timed_out(node)
        if not conn.retiring and self._tg is not None:
            # Its answer may still come: give it the Producer's timeout before closing.
            self._tg.start_soon(conn.close, self.timeout)
