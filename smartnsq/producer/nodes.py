"""Which nsqd a publish goes to, sans-IO.

:class:`NodeHealth` is one nsqd's health (avoided for a growing while after a failure, then
tried by one request at a time) and counters; :class:`Node` adds its connections, of the
front door's kind, and which of them the next request takes; :func:`rank` orders nodes for
the next request (the healthy ones by load, then stalled ones, then those down).
:class:`Nodes` holds every nsqd of a producer and routes: the nsqd (and partition) of a
publish from the topic's layout, the configured nsqd in turn, and what opening a connection,
losing one or a timeout means for a node's health. It reads the front door's clock, given to
it, and does no I/O.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Generic, Protocol, TypeVar

from smartnsq.errors import (
    ConnectFailed,
    ConnectionClosed,
    InvalidArgument,
    NoNsqdAvailable,
    NotSupported,
    ProtocolError,
    ServerError,
)
from smartnsq.lookup.model import TopicLayout
from smartnsq.notice import settings_refused
from smartnsq.ordered.sharding import ShardingKey
from smartnsq.producer.settings import Settings
from smartnsq.protocol.handshake import Features, config_refusal
from smartnsq.stats import ProducerNodeStats, ProducerStats

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
        # Counted inline by the IO (no call per request); read by stats().
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
    """What the nodes read of a connection (async or blocking)."""

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


N = TypeVar("N", bound=Node[Any, Any])


class Nodes(Generic[N]):
    """Every nsqd of one producer, and which one a publish goes to (see the module).

    ``new_node`` makes a node of the front door's kind (its connections and lock); ``now`` is
    the front door's clock.
    """

    def __init__(
        self, settings: Settings, new_node: Callable[[str], N], now: Callable[[], float]
    ) -> None:
        self.now = now
        self._new_node = new_node
        self.by_address: dict[str, N] = {}
        # The configured nsqd, in the order given (never replaced: the IO keeps it).
        self.direct: list[N] = [self.node(a) for a in settings.nsqd_tcp_addresses]
        self.per_node = settings.connections_per_nsqd
        self._sharder = settings.sharder
        self._stall_after = settings.stall_after
        self._rr: dict[str, int] = {}  # per topic: whose turn is next
        self._next = 0  # the configured nsqd whose turn is next

    def node(self, address: str) -> N:
        node = self.by_address.get(address)
        if node is None:
            node = self.by_address[address] = self._new_node(address)
        return node

    def stats(self, failed: int, retried: int) -> ProducerStats:
        return producer_stats(list(self.by_address.values()), failed, retried)

    # -- routing ---------------------------------------------------------------------------------

    def pick(
        self, topic: str, partition: int | None, key: ShardingKey | None, layout: TopicLayout
    ) -> tuple[str, int | None]:
        """The nsqd (and partition) for one publish, from the topic's write layout."""
        if not layout.partitioned:
            nodes = layout.producers
            if not nodes:
                raise NoNsqdAvailable(f"lookupd lists no nsqd for topic {topic!r}")
            addresses = [n.tcp_address for n in nodes]
            return addresses[self.take_turns(topic, addresses)], partition
        meta = layout.meta
        count = meta.partition_num if meta is not None and meta.partition_num else 0
        if key is not None:
            if not count:
                raise NotSupported(
                    f"lookupd gave no partition count for {topic!r}; cannot shard by key"
                )
            partition = self._sharder(key, count)
        if partition is not None:
            if count and partition >= count:
                raise InvalidArgument(
                    f"partition {partition} does not exist: topic {topic!r} has {count}"
                )
            node = layout.partitions.get(partition)
            if node is None:  # never remap: that would break the key's order
                raise NoNsqdAvailable(
                    f"partition {partition} of {topic!r} has no writable leader right now"
                )
            return node.tcp_address, partition
        parts = sorted(layout.partitions)
        if not parts:
            raise NoNsqdAvailable(f"no partition of {topic!r} is writable right now")
        addresses = [layout.partitions[p].tcp_address for p in parts]
        # By position: one nsqd may lead several partitions, and each takes its turn.
        i = self.take_turns(topic, addresses)
        return addresses[i], parts[i]

    def all_down(self, layout: TopicLayout) -> bool:
        """Every nsqd listed for a classic topic is avoided now (down, no probe due)."""
        if layout.partitioned or not layout.producers:
            return False
        now = self.now()
        nodes = self.by_address
        for listed in layout.producers:
            node = nodes.get(listed.tcp_address)
            if node is None or not node.failures or now >= node.down_until:
                return False
        return True

    def take_turns(self, topic: str, addresses: list[str]) -> int:
        """The index of the next of ``addresses`` in turn; when that nsqd is busy or down,
        the best by :func:`rank` (the turn order breaks ties), claiming a recovering one
        (when all are down: the next one anyway)."""
        i = self._rr.get(topic, 0)
        self._rr[topic] = i + 1
        n = len(addresses)
        first = i % n
        nodes = self.by_address
        node = nodes.get(addresses[first])
        if node is None or (not node.failures and node.idle()):  # no clock, no sorting
            return first
        now = self.now()
        stall = self._stall_after
        order = [(i + k) % n for k in range(n)]
        order.sort(key=lambda j: rank(nodes.get(addresses[j]), now, stall))
        for j in order:
            node = nodes.get(addresses[j])
            if node is None or node.claim(now):
                return j
        return first

    def direct_candidates(self) -> Iterator[N]:
        """The configured nsqd to try, in turn: those that work by :func:`rank` (the least
        busy first), then stalled ones, then those down, recovering soonest first; one that
        is down is passed over unless it is the last resort. Lazy: a recovering node is
        claimed only when its turn comes."""
        nodes = self.direct
        if not nodes:
            raise NoNsqdAvailable("no nsqd_tcp_addresses configured")
        now = self.now()
        n = len(nodes)
        start = self._next
        self._next = (start + 1) % n
        order = [nodes[(start + i) % n] for i in range(n)]
        stall = self._stall_after
        order.sort(key=lambda node: rank(node, now, stall))
        for node in order:
            if not node.failures or node.claim(now) or node is order[-1]:
                yield node

    # -- health ----------------------------------------------------------------------------------

    @contextmanager
    def opening(self, node: N) -> Iterator[None]:
        """Around opening a connection to ``node``: on failure, mark it down and raise a
        connection failure, which the caller retries elsewhere.

        Unreachable, not speaking NSQ, or a bad address (port 0 from a lookupd) are all
        connection failures; a server error stays one. Settings nsqd refuses raise
        :class:`ConfigRefused`, which is not retried (said loudly once when that nsqd took
        them before: restarted with other limits, say).
        """
        try:
            yield
        except (ConnectionClosed, ProtocolError, InvalidArgument, ServerError) as exc:
            node.errors += 1
            node.mark_down(self.now(), f"cannot connect: {exc}")
            refused = config_refusal(exc, node.address)
            if refused is not None:
                if node.published:
                    settings_refused(log, node.address, refused, error=True)
                if refused is exc:
                    raise
                raise refused from exc
            if isinstance(exc, ConnectionClosed | ServerError):
                raise
            raise ConnectFailed(f"nsqd {node.address}: {exc}") from exc

    def connected(self, node: N) -> None:
        """A new connection to ``node`` is open (not proof yet that it works)."""
        level = logging.DEBUG if node.failures else logging.INFO  # recovery logs at INFO
        log.log(level, "connected to nsqd %s", node.address)

    def timed_out(self, node: N) -> None:
        """A request to ``node`` timed out: avoid it for a while (the caller stops using the
        connection)."""
        node.errors += 1
        node.mark_down(self.now(), "did not answer a publish in time")

    def forget(self, node: N, conn: Conn, closing: bool) -> None:
        """``conn`` ended: drop it; if it was lost (not closed by us, nor while the producer
        is ``closing``), avoid its nsqd."""
        if node.drop(conn) and not closing and not conn.retiring:
            node.mark_down(self.now(), f"connection lost: {conn.close_reason}")
