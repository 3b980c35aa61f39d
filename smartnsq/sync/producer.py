"""The blocking publishing front door: :class:`Producer` for plain threads.

Publishing, sending and retrying are :class:`~smartnsq.sync.publish_io.SyncPublisher`'s,
generated from the async :class:`~smartnsq.publish_io.AsyncPublisher`; this module holds what
only the blocking producer does: locks with deadlines, opening a blocking connection, and
asking lookupd on a short-lived event loop.
"""

from __future__ import annotations

import contextlib
import threading
import time

import anyio

from smartnsq._checks import FORKS
from smartnsq.errors import ConfigRefused, ConnectionClosed, NSQError, NSQTimeout, UsedAfterFork
from smartnsq.lookup.model import TopicLayout
from smartnsq.publishing import Node
from smartnsq.sync.connection import SyncConnection
from smartnsq.sync.publish_io import SyncPublisher

_Node = Node[SyncConnection, threading.Lock]


class Producer(SyncPublisher[_Node]):
    """Publishes messages to one or more nsqd from plain (non-async) code.

    The same arguments, methods and guarantees as [`smartnsq.Producer`][smartnsq.Producer],
    without ``await``:

        with Producer(["127.0.0.1:4150"]) as producer:
            producer.publish("events", b"hello")

    Each call returns once nsqd has acknowledged the message, or raises. It is thread-safe:
    many threads may publish through one Producer at once; their requests are pipelined over
    its connections and every caller gets its own answer. Publishing uses blocking sockets:
    no event loop and no background thread. Lookups (the first publish to a topic through
    lookupd, about once per ``lookupd_poll_interval``, and after cluster errors) run the same
    lookup code as the async client on a short-lived event loop in the calling thread.
    A Producer cannot be used after ``fork()``
    ([`UsedAfterFork`][smartnsq.errors.UsedAfterFork]): create one in the child.
    """

    def _setup(self) -> None:
        self._lookup_lock = threading.Lock()
        self._thread = None  # any thread may publish
        self._forks = FORKS[0]
        self._open = True  # usable without ``with``

    def _new_node(self, address: str) -> _Node:
        return Node(address, threading.Lock())

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> Producer:
        """Connect to the configured nsqd until one answers (see the async Producer).

        Raises:
            ConfigRefused: An nsqd refused the settings; the Producer is closed.
        """
        try:
            self._check_settings()
        except ConfigRefused:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, timeout: float = 5.0) -> None:
        """Wait (briefly) for outstanding answers, then close every connection.

        ``with`` calls it on exit; calling it again does nothing.

        Args:
            timeout: Seconds each connection waits for its outstanding answers, default
                5.0; 0 closes at once.
        """
        if self._closed:
            return
        self._closed = True
        self._open = False
        for node in list(self._by_address.values()):
            for conn in list(node.connections):
                conn.close(timeout)

    # -- the publisher's hooks -------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise self._not_open()
        if self._forks != FORKS[0]:  # cheaper than os.getpid() on every publish
            raise UsedAfterFork(
                "this Producer was created in the parent process and cannot be used after "
                "fork(): its connections belong to the parent; create a new Producer in the child"
            )

    def _not_open(self) -> NSQError:
        return NSQError("this Producer is closed")

    def _bound(self, limit: float) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()  # every step is bounded by the deadline itself

    def _refresh(self, topic: str, deadline: float, everywhere: bool = False) -> TopicLayout:
        """Ask the lookupds on a short-lived event loop, one thread at a time."""
        assert self._lookup is not None
        lookup = self._lookup
        if not self._lookup_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise NSQTimeout("waited too long for another thread's lookup")
        try:

            async def ask() -> TopicLayout:
                async with lookup:
                    with anyio.fail_after(max(0.0, deadline - time.monotonic())):
                        if everywhere:
                            return await lookup.every_nsqd(topic)
                        return await lookup.refresh(topic, "w")

            try:
                return anyio.run(ask)
            except TimeoutError:
                raise NSQTimeout(f"lookup of {topic!r} did not finish in time") from None
        finally:
            self._lookup_lock.release()

    def _node_connection(self, node: _Node, deadline: float) -> SyncConnection:
        conn = node.reusable(self._per_node)
        if conn is not None:
            return conn
        if not node.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise NSQTimeout(f"waited too long for a connection to nsqd {node.address}")
        try:
            conn = node.reusable(self._per_node)
            if conn is not None:
                return conn
            if self._closed:
                raise NSQError("this Producer is closed")
            with self._opening(node):
                conn = SyncConnection.open(
                    node.address, self._config, max(0.001, deadline - time.monotonic())
                )
            self._connected(node)
            node.add(conn)
            return conn
        finally:
            node.lock.release()

    def _discard(self, node: _Node, conn: SyncConnection, close: bool, exc: Exception) -> None:
        if isinstance(exc, ConnectionClosed):  # no callback tells a blocking producer
            self._forget(node, conn)
        elif close and node.drop(conn):
            conn.retire()  # its other requests may still be answered, within their time

    def _suspect(self, node: _Node, conn: SyncConnection) -> None:
        self._timed_out(node)
        if node.drop(conn):
            # Closed once no thread waits on it: the others wait for their answers until
            # their own deadlines (failing them would leave their outcome unknown sooner).
            conn.retire()
