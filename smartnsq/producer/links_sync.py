"""What only the blocking producer does: :class:`SyncLinks`.

Locks with deadlines, opening a blocking connection, setting one aside, and asking lookupd on
a short-lived event loop; any thread may publish, none after ``fork()``. The async
producer's are in :mod:`smartnsq.producer.links`; the generated IO
(:mod:`smartnsq.producer.io_sync`) uses either through the same methods.

The blocking :class:`smartnsq.sync.Producer` is generated from the async one, all but its
class docstring: that is :data:`PRODUCER_DOC`, here, which ``scripts/unasync.py`` puts in.
"""

from __future__ import annotations

import contextlib
import threading
import time

import anyio

from smartnsq._checks import FORKS
from smartnsq.errors import ConnectionClosed, NSQError, NSQTimeout, UsedAfterFork
from smartnsq.lookup.manager import LookupManager
from smartnsq.lookup.model import TopicLayout
from smartnsq.net.blocking import SyncConnection
from smartnsq.producer.nodes import Node, Nodes
from smartnsq.producer.settings import Settings

SyncLinkNode = Node[SyncConnection, threading.Lock]

PRODUCER_DOC = """Publishes messages to one or more nsqd from plain (non-async) code.

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


def _new_node(address: str) -> SyncLinkNode:
    return Node(address, threading.Lock())


class SyncLinks:
    """The blocking producer's connections, lookups and owner (see the module)."""

    def __init__(self, settings: Settings) -> None:
        self.nodes: Nodes[SyncLinkNode] = Nodes(settings, _new_node, time.monotonic)
        self.lookup = (
            LookupManager(settings.lookupds, cache_ttl=settings.lookupd_poll_interval)
            if settings.lookupds
            else None
        )
        self.thread: int | None = None  # any thread may publish: checked on every publish
        self.forks = FORKS[0]
        self.open = True  # usable without ``with``
        self.closed = False  # close() was called
        self._config = settings.config
        self._per_node = settings.connections_per_nsqd
        self._lookup_lock = threading.Lock()

    def enter(self) -> None:
        """Nothing to bind: a blocking producer is usable from its creation."""

    def close(self, timeout: float) -> None:
        if self.closed:
            return
        self.closed = True
        self.open = False
        for node in list(self.nodes.by_address.values()):
            for conn in list(node.connections):
                conn.close(timeout)

    def check_usable(self) -> None:
        """Raise when this producer may not publish: closed, or in a child after fork()."""
        if self.closed:
            raise self.not_open()
        if self.forks != FORKS[0]:  # cheaper than os.getpid() on every publish
            raise UsedAfterFork(
                "this Producer was created in the parent process and cannot be used after "
                "fork(): its connections belong to the parent; create a new Producer in the child"
            )

    def not_open(self) -> NSQError:
        return NSQError("this Producer is closed")

    def bound(self, limit: float) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()  # every step is bounded by the deadline itself

    def refresh(self, topic: str, deadline: float, everywhere: bool = False) -> TopicLayout:
        """Ask the lookupds on a short-lived event loop, one thread at a time."""
        assert self.lookup is not None
        lookup = self.lookup
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

    def connection(self, node: SyncLinkNode, deadline: float) -> SyncConnection:
        conn = node.reusable(self._per_node)
        if conn is not None:
            return conn
        if not node.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise NSQTimeout(f"waited too long for a connection to nsqd {node.address}")
        try:
            conn = node.reusable(self._per_node)
            if conn is not None:
                return conn
            if self.closed:
                raise NSQError("this Producer is closed")
            nodes = self.nodes
            with nodes.opening(node):
                conn = SyncConnection.open(
                    node.address, self._config, max(0.001, deadline - time.monotonic())
                )
            nodes.connected(node)
            node.add(conn)
            return conn
        finally:
            node.lock.release()

    def discard(
        self, node: SyncLinkNode, conn: SyncConnection, close: bool, exc: Exception
    ) -> None:
        if isinstance(exc, ConnectionClosed):  # no callback tells a blocking producer
            self.nodes.forget(node, conn, self.closed)
        elif close and node.drop(conn):
            conn.retire()  # its other requests may still be answered, within their time

    def suspect(self, node: SyncLinkNode, conn: SyncConnection) -> None:
        self.nodes.timed_out(node)
        if node.drop(conn):
            # Closed once no thread waits on it: the others wait for their answers until
            # their own deadlines (failing them would leave their outcome unknown sooner).
            conn.retire()
