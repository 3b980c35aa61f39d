"""What only the async producer does: :class:`Links`.

The event loop (thread) and process a producer belongs to, the task group its connections run
in, opening a connection to an nsqd, setting one aside, and asking lookupd. The blocking
producer's are in :mod:`smartnsq.producer.links_sync`; the IO
(:mod:`smartnsq.producer.io`) uses either through the same methods.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import anyio
import anyio.abc

from smartnsq._checks import FORKS, owner, wrong_owner
from smartnsq.errors import NSQError, NSQTimeout
from smartnsq.lookup.manager import LookupManager
from smartnsq.lookup.model import TopicLayout
from smartnsq.net.connection import Connection
from smartnsq.producer.nodes import Node, Nodes
from smartnsq.producer.settings import Settings

LinkNode = Node[Connection, anyio.Lock]


def _new_node(address: str) -> LinkNode:
    return Node(address, anyio.Lock())


class Links:
    """The async producer's connections, lookups and owner (see the module)."""

    def __init__(self, settings: Settings) -> None:
        self.nodes: Nodes[LinkNode] = Nodes(settings, _new_node, anyio.current_time)
        self.lookup = (
            LookupManager(settings.lookupds, cache_ttl=settings.lookupd_poll_interval)
            if settings.lookupds
            else None
        )
        # Who may publish: the thread and fork generation that entered (none until then).
        self.thread: int | None = None
        self.forks = FORKS[0]
        self.open = False  # publishing is allowed: entered, not closed
        self.closed = False  # close() was called
        self._config = settings.config
        self._per_node = settings.connections_per_nsqd
        self._timeout = settings.timeout
        self._tg: anyio.abc.TaskGroup | None = None

    async def enter(self) -> None:
        """Bind to the caller's event loop and open the task group (once)."""
        if self._tg is not None or self.closed:
            raise NSQError("a Producer can be entered only once")
        self.thread, self.forks = owner()
        if self.lookup is not None:
            await self.lookup.__aenter__()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self.open = True

    async def close(self, timeout: float) -> None:
        if self.closed:
            return
        self.closed = True
        self.open = False
        with anyio.CancelScope(shield=True):
            for node in self.nodes.by_address.values():
                for conn in list(node.connections):
                    await conn.close(timeout)
            if self.lookup is not None:
                await self.lookup.__aexit__(None, None, None)
        if self._tg is not None:
            self._tg.cancel_scope.cancel()
            await self._tg.__aexit__(None, None, None)

    def check_usable(self) -> None:
        """Raise when this producer may not publish from here (another thread or process);
        called when the caller's thread or fork generation is not the owner's."""
        wrong_owner("Producer", self.thread, self.forks)

    def not_open(self) -> NSQError:
        """The error for a publish while the producer is not open."""
        return NSQError("use the Producer inside 'async with Producer(...)' (or it is closed)")

    def bound(self, limit: float) -> AbstractContextManager[object]:
        """Around a publish's slow path (connecting, lookups, retries) of ``limit`` seconds."""
        # A request past the deadline raises NSQTimeout itself (and so names its connection);
        # this outer bound covers connecting and lookups.
        return anyio.fail_after(limit + 0.2)

    async def refresh(self, topic: str, deadline: float, everywhere: bool = False) -> TopicLayout:
        """Ask the lookupds for ``topic``'s write layout; ``everywhere``: every nsqd they
        know (``LookupManager.every_nsqd``)."""
        assert self.lookup is not None
        try:
            with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
                if everywhere:
                    return await self.lookup.every_nsqd(topic)
                return await self.lookup.refresh(topic, "w")
        except TimeoutError:
            raise NSQTimeout(f"lookup of {topic!r} did not finish in time") from None

    async def connection(self, node: LinkNode, deadline: float) -> Connection:
        """A connection to ``node``: a reusable one, or a new one."""
        # The deadline is bound()'s: its cancel scope covers the wait for the lock and opening.
        conn = node.reusable(self._per_node)
        if conn is not None:
            return conn
        async with node.lock:
            conn = node.reusable(self._per_node)
            if conn is not None:
                return conn
            nodes = self.nodes
            with nodes.opening(node):
                conn = await Connection.open(node.address, self._config)
            # Not marked up yet: only an answered request shows the node works.
            nodes.connected(node)
            conn.on_close = lambda c: nodes.forget(node, c, self.closed)
            node.add(conn)
            assert self._tg is not None
            self._tg.start_soon(conn.run)
            return conn

    def discard(self, node: LinkNode, conn: Connection, close: bool, exc: Exception) -> None:
        """A request on ``conn`` failed with ``exc`` and will be retried; ``close``: close
        ``conn`` first."""
        # A lost connection forgets itself (on_close); one to close is closed in the background.
        if close and self._tg is not None:
            # Its other requests may still be answered: they get the Producer's timeout.
            self._tg.start_soon(conn.close, self._timeout)

    def suspect(self, node: LinkNode, conn: Connection) -> None:
        """A request timed out: send nothing more through ``conn``, and avoid its nsqd."""
        self.nodes.timed_out(node)
        if not conn.retiring and self._tg is not None:
            # Its answer may still come: give it the Producer's timeout before closing.
            self._tg.start_soon(conn.close, self._timeout)
