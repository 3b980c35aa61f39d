"""The nsqd a producer publishes to, as the producers' shared core sees them, sans-IO.

:class:`NodeHealth` is one nsqd's health (avoided for a growing while after a failure, then
tried by one request at a time) and counters; :class:`Node` adds its connections, of the
front door's kind, and which of them the next request takes; :func:`rank` orders nodes for
the next request (the healthy ones by load, then stalled ones, then those down).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from typing import Any, Generic, Protocol, TypeVar

from smartnsq.errors import NotSupported
from smartnsq.observe.stats import ProducerNodeStats, ProducerStats
from smartnsq.protocol.handshake import Features

log = logging.getLogger("smartnsq.producer")

_MAX_DOWN = 30.0  # longest we avoid an nsqd that failed us
_PROBE_HOLD = 5.0  # while one request tries a recovering nsqd, the others go elsewhere


class NodeHealth:
    """One nsqd's health and counters.

    A node that failed (could not be reached, answered garbage, let a request time out) is
    avoided for a growing while; then one request at a time may try it until one succeeds.
    Each outage is logged once: WARNING when it starts, DEBUG while it lasts, INFO when the
    node answers again.
    """

    __slots__ = ("address", "down_until", "errors", "failures", "published", "requests")

    def __init__(self, address: str) -> None:
        self.address = address
        self.failures = 0
        self.down_until = 0.0
        # Counted inline by the front doors (no call per request); read by stats().
        self.published = 0
        self.requests = 0
        self.errors = 0

    def mark_down(self, now: float, reason: str) -> None:
        self.failures += 1
        delay = min(_MAX_DOWN, 0.1 * 2 ** min(self.failures, 10))
        self.down_until = now + delay * random.uniform(0.5, 1.0)
        if self.failures == 1:
            log.warning(
                "nsqd %s: %s; avoiding it for now (logged once until it recovers)",
                self.address,
                reason,
            )
        else:
            log.debug("nsqd %s: %s (failure %d in a row)", self.address, reason, self.failures)

    def answered(self, count: int) -> None:
        """A request of ``count`` messages was acknowledged: proof the node works."""
        self.requests += 1
        self.published += count
        if self.failures:
            self.mark_up()

    def mark_up(self) -> None:
        if self.failures:
            log.info("nsqd %s answers again after %d failures", self.address, self.failures)
        self.failures = 0
        self.down_until = 0.0

    def claim(self, now: float) -> bool:
        """Whether a request may go here now; a recovering node takes one at a time."""
        if not self.failures:
            return True
        if now < self.down_until:
            return False
        self.down_until = now + _PROBE_HOLD
        return True

    def load(self) -> tuple[int, int]:
        """(open connections, requests awaiting an answer); the front doors' nodes know."""
        return 0, 0


class Conn(Protocol):
    """What the core reads of a front door's connection."""

    @property
    def pending(self) -> int: ...  # requests awaiting an answer

    @property
    def waiting_since(self) -> float: ...  # when the oldest of them was sent; inf: none

    @property
    def usable(self) -> bool: ...

    @property
    def retiring(self) -> bool: ...  # closed (or closing) by us, not lost

    @property
    def close_reason(self) -> BaseException | None: ...


C = TypeVar("C", bound=Conn)
L = TypeVar("L")


class Node(NodeHealth, Generic[C, L]):
    """One nsqd: its health and its connections (of the front door's kind ``C``), and the
    lock (``L``, the front door's kind) held while one is opened."""

    __slots__ = ("connections", "lock")

    def __init__(self, address: str, lock: L) -> None:
        super().__init__(address)
        # Replaced, never changed in place: a reader in another thread sees a whole list.
        self.connections: list[C] = []
        self.lock = lock

    def load(self) -> tuple[int, int]:
        conns = self.connections
        return len(conns), sum(c.pending for c in conns)

    def idle(self) -> bool:
        """No request awaits an answer (the usual case of a sequential publisher)."""
        for conn in self.connections:  # noqa: SIM110 - a third of any()'s cost, per publish
            if conn.pending:
                return False
        return True

    def add(self, conn: C) -> None:
        """A new connection; closed ones are dropped on the way (the blocking producer
        learns of some only here). One still closing stays, for close() to wait on."""
        self.connections = [*(c for c in self.connections if c.close_reason is None), conn]

    def drop(self, conn: C) -> bool:
        """Forget ``conn``; whether it was still one of ours."""
        conns = self.connections
        if conn not in conns:
            return False
        self.connections = [c for c in conns if c is not conn]
        return True

    def reusable(self, most: int) -> C | None:
        """The connection the next request should take instead of opening another (at most
        ``most`` per nsqd): the usable one with the fewest requests pending, if it is idle or
        there are ``most`` already; None: open one."""
        conns = self.connections
        if len(conns) == 1:  # the usual case: one connection, nothing to compare
            conn = conns[0]
            if most == 1 or not conn.pending:
                return conn if conn.usable else None
        conns = [c for c in conns if c.usable]
        if not conns:
            return None
        best = min(conns, key=_pending)
        return best if best.pending == 0 or len(conns) >= most else None


def _pending(conn: Conn) -> int:
    return conn.pending


_INF = float("inf")


def rank(node: Node[Any, Any] | None, now: float, stall_after: float) -> tuple[int, float]:
    """Sort key of a node for the next request, lower first (ties: the caller's turn order).

    First the nodes that work, by requests awaiting an answer: a node that got slower gets
    fewer, and one that stopped answering gets new ones only while the others are as busy;
    ``None``, a node not connected yet, counts as idle. Then the stalled: an oldest request
    unanswered for more than ``stall_after`` seconds; nsqd answers a publish at once, so it
    has most likely stopped answering. It is not marked down: when it answers, it ranks as before.
    Last, the nodes that are down, the one recovering soonest first.
    """
    if node is None:
        return 0, 0.0
    if node.failures and now < node.down_until:
        return 2, node.down_until - now
    pending = 0
    oldest = _INF
    for conn in node.connections:
        pending += conn.pending
        since = conn.waiting_since
        if since < oldest:
            oldest = since
    return (1 if now - oldest > stall_after else 0), pending


def check_server(
    features: Features, address: str, part: int | None, deferred: bool, ext: bool = False
) -> None:
    """Refuse, before sending, what this kind of nsqd cannot do."""
    if ext and not features.youzan:
        raise NotSupported(
            f"nsqd {address} is a classic nsqd, which has no ext headers; publish without "
            "headers, tag(s) and compression (compress_topics)"
        )
    if deferred and features.youzan:
        raise NotSupported(
            f"nsqd {address} is a Youzan HA server, which has no deferred "
            "publish (DPUB); publish without delay"
        )
    if part is not None and not features.youzan:
        raise NotSupported(
            f"nsqd {address} is a classic nsqd, which has no partitions; publish without partition="
        )


def producer_stats(nodes: Sequence[Node[Any, Any]], failed: int, retried: int) -> ProducerStats:
    """A producer's counters, in total and per nsqd (``failed``, ``retried``: its own)."""
    per = {}
    for node in nodes:
        connections, pending = node.load()
        per[node.address] = ProducerNodeStats(
            address=node.address,
            published=node.published,
            requests=node.requests,
            errors=node.errors,
            connections=connections,
            pending=pending,
            down=node.failures > 0,
        )
    every = per.values()
    return ProducerStats(
        published=sum(n.published for n in every),
        requests=sum(n.requests for n in every),
        failed=failed,
        retried=retried,
        connections=sum(n.connections for n in every),
        nodes=per,
    )
