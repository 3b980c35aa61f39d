"""The publishing front door: :class:`Producer` (async).

Settings, planning, routing and node health are :class:`~smartnsq.publishing.ProducerCore`'s,
shared with the blocking :class:`smartnsq.sync.Producer`; this module sends and waits.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import anyio
import anyio.abc

from smartnsq._checks import FORKS, get_ident, owner, wrong_owner
from smartnsq.connection import Connection
from smartnsq.errors import (
    ConnectionClosed,
    InvalidArgument,
    NoNsqdAvailable,
    NSQError,
    NSQTimeout,
    ProtocolError,
    ServerError,
)
from smartnsq.lookup.manager import LookupManager
from smartnsq.ordered.sharding import ShardingKey
from smartnsq.protocol.message import PublishResult
from smartnsq.publishing import (
    DEFAULT_MAX_BODY_SIZE,
    DEFAULT_MAX_MESSAGE_SIZE,
    Build,
    NodeHealth,
    ProducerCore,
    Request,
    batch_failed,
    check_server,
    emit_publish,
    timeout_error,
)

__all__ = ["DEFAULT_MAX_BODY_SIZE", "DEFAULT_MAX_MESSAGE_SIZE", "Producer", "emit_publish"]

log = logging.getLogger("smartnsq.producer")


class _Node(NodeHealth):
    """One nsqd: its health and its connections."""

    __slots__ = ("connections", "lock")

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.connections: list[Connection] = []
        self.lock = anyio.Lock()


class Producer(ProducerCore[_Node]):
    """Publishes messages to one or more nsqd.

    Use it as an async context manager::

        async with Producer(nsqd_tcp_addresses=["127.0.0.1:4150"]) as producer:
            await producer.publish("events", b"hello")

    Each call returns once nsqd has acknowledged the message, or raises. Requests are
    pipelined: many tasks may publish at once over the same connection. On a connection
    failure, or a server error that is safe to retry, the request is retried (on another nsqd
    when there is one) until ``max_retries`` or the call's ``timeout`` runs out. A retry after
    a connection broke mid-request can duplicate a message: NSQ delivers at least once.
    An nsqd that cannot be reached, does not speak NSQ or lets a publish time out is avoided
    for a while (growing with each failure), then tried again by one request at a time.

    ``max_delay`` (seconds, default one hour as nsqd's ``--max-req-timeout``) is the longest
    ``delay`` :meth:`publish` accepts; raise it when your nsqd allows more.
    ``auth_over_plaintext=False`` refuses to send ``auth_secret`` to an nsqd without TLS.
    A Producer belongs to the event loop (thread) and process that entered it; for plain
    threads use :class:`smartnsq.sync.Producer`.

    Args:
        compress_topics: Youzan ext topics whose bodies the producer compresses itself, as
            go-nsq's ``TopicsForCompress`` does: a body of at least ``compress_min_size``
            bytes is sent compressed with PUB_EXT (MPUB_EXT) and the ext headers
            ``nsq.client.compress`` and ``nsq.msg.size``, which go-nsq and smartnsq
            consumers decompress. The topics must be ext topics. Default: none.
        compress_codec: ``"snappy"`` (default), ``"gzip"`` or ``"lz4"`` (needs
            ``pip install 'smartnsq[lz4]'``; a body that lz4 cannot shrink is sent as it is).
        compress_min_size: smallest body, in bytes, that is compressed (go-nsq's
            ``MessageSizeForCompress``, default 20480).
    """

    def _setup(self) -> None:
        self._lookup = (
            LookupManager(self._lookupds, cache_ttl=self._poll_interval) if self._lookupds else None
        )
        self._thread: int | None = None  # owner thread and fork generation, set on entry
        self._forks = FORKS[0]
        self._tg: anyio.abc.TaskGroup | None = None
        self._closed = False

    def _new_node(self, address: str) -> _Node:
        return _Node(address)

    def _now(self) -> float:
        return anyio.current_time()

    # -- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> Producer:
        if self._tg is not None or self._closed:
            raise NSQError("a Producer can be entered only once")
        self._thread, self._forks = owner()
        if self._lookup is not None:
            await self._lookup.__aenter__()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Wait for outstanding answers (briefly), then close every connection."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            for node in self._by_address.values():
                for conn in list(node.connections):
                    await conn.close()
            if self._lookup is not None:
                await self._lookup.__aexit__(None, None, None)
        if self._tg is not None:
            self._tg.cancel_scope.cancel()
            await self._tg.__aexit__(None, None, None)

    # -- publishing ------------------------------------------------------------------------------

    async def publish(
        self,
        topic: str,
        body: bytes,
        *,
        delay: float | None = None,
        partition: int | None = None,
        sharding_key: ShardingKey | None = None,
        trace_id: int | None = None,
        headers: Mapping[str, Any] | None = None,
        tag: str | None = None,
        timeout: float | None = None,
    ) -> PublishResult | None:
        """Publish one message and return once nsqd has acknowledged it.

        ``body`` is bytes or any other bytes-like object (bytearray, memoryview, ...); its
        bytes are sent. ``delay`` (seconds) defers delivery (DPUB; classic nsqd only). On a
        partitioned (Youzan) topic, ``sharding_key`` picks the partition (same key, same
        partition, in order) and ``partition`` names one outright; otherwise partitions take
        turns.
        ``trace_id`` (or tracing switched on for the topic with ``producer.trace``) sends a
        traced publish and returns a :class:`PublishResult`; ``headers`` sends the JSON ext
        header of an ext topic. Plain publishes return ``None``.
        ``delay`` may not exceed ``max_delay`` (see :class:`Producer`).

        Args:
            tag: dispatch tag of the message (Youzan ext topics): only consumers whose
                ``desired_tag`` is the same receive it (untagged consumers while none is
                connected). 1-100 ASCII letters, digits, ``_`` or ``-``; sent as the ext
                header ``##client_dispatch_tag``. A topic that is not an ext topic refuses
                it with :class:`~smartnsq.errors.ExtNotSupported`.
        """
        if self._thread != get_ident() or self._forks != FORKS[0]:
            wrong_owner("Producer", self._thread, self._forks)
        plan = self._plan_publish(
            topic, body, delay, partition, sharding_key, trace_id, headers, timeout, tag
        )
        if type(plan) is bytes:
            await self._send(plan, timeout)
            return None
        assert isinstance(plan, Request)
        answer, address, part = await self._send_routed(
            topic,
            plan.build,
            partition,
            sharding_key,
            timeout,
            deferred=plan.deferred,
            ext=plan.ext,
        )
        return self._result(topic, plan, answer, address, part)

    async def publish_many(
        self,
        topic: str,
        bodies: Iterable[bytes],
        *,
        partition: int | None = None,
        sharding_key: ShardingKey | None = None,
        trace_ids: Sequence[int] | None = None,
        tags: Sequence[str | None] | None = None,
        timeout: float | None = None,
    ) -> list[PublishResult] | None:
        """Publish several messages with MPUB, split into as few batches as nsqd accepts.

        Batches go out in order, all to one partition. If one fails after earlier ones
        succeeded, :class:`~smartnsq.errors.PartialPublish` says how many messages were
        acknowledged. With ``trace_ids`` (one per message; generated when tracing is on for the
        topic) it sends MPUB_TRACE and returns one :class:`PublishResult` per batch.

        Args:
            tags: one dispatch tag (or ``None``) per message, as ``trace_ids`` gives one
                trace id per message; sent with MPUB_EXT (see ``tag`` of :meth:`publish`).
                Cannot be combined with ``trace_ids``.
        """
        if self._thread != get_ident() or self._forks != FORKS[0]:
            wrong_owner("Producer", self._thread, self._forks)
        plan = self._plan_many(topic, bodies, partition, sharding_key, trace_ids, timeout, tags)
        if type(plan) is bytes:
            await self._send(plan, timeout)
            return None
        assert not isinstance(plan, bytes)
        results: list[PublishResult] = []
        done = 0
        for request in plan.requests:
            try:
                if plan.routed:
                    answer, address, part = await self._send_routed(
                        topic, request.build, partition, sharding_key, timeout, ext=request.ext
                    )
                    result = self._result(topic, request, answer, address, part)
                    if result is not None:
                        results.append(result)
                else:
                    await self._send(request.build(None), timeout)
            except NSQError as exc:
                raise batch_failed(exc, done, plan.total)  # noqa: B904 - it sets the cause
            done += request.count
        return results if plan.traced else None

    # -- internals -------------------------------------------------------------------------------

    async def _send(self, data: bytes, timeout: float | None) -> bytes:
        """Plain publish to the configured nsqd (no routing): the fast path."""
        if self._tg is None or self._closed:
            raise NSQError("use the Producer inside 'async with Producer(...)' (or it is closed)")
        limit = self.timeout if timeout is None else timeout
        conn = self._ready_connection()
        if conn is not None:
            node = self._direct[0]
            try:
                answer = await conn.request(data, publish=True, timeout=limit)
            except NSQTimeout:
                self._suspect(node, conn)
                raise timeout_error(limit) from None
            except (ConnectionClosed, ServerError) as exc:
                self._check_retryable(exc, conn)
            else:
                if node.failures:
                    node.mark_up()
                return answer
        answer, _, _ = await self._send_routed(None, lambda p: data, None, None, timeout)
        return answer

    def _ready_connection(self) -> Connection | None:
        if len(self._direct) == 1:
            conns = self._direct[0].connections
            if conns and len(conns) >= self._per_node:
                best = min(conns, key=_pending) if len(conns) > 1 else conns[0]
                if best.usable:
                    return best
        return None

    def _check_retryable(self, exc: Exception, conn: Connection | None) -> None:
        if self._retry_action(exc) and conn is not None and self._tg is not None:
            self._tg.start_soon(conn.close, 0.0)

    async def _send_routed(
        self,
        topic: str | None,
        build: Build,
        partition: int | None,
        key: ShardingKey | None,
        timeout: float | None,
        *,
        deferred: bool = False,
        ext: bool = False,
    ) -> tuple[bytes, str, int | None]:
        """Route, send, retry. Returns (answer, nsqd address, partition)."""
        if self._tg is None or self._closed:
            raise NSQError("use the Producer inside 'async with Producer(...)' (or it is closed)")
        limit = self.timeout if timeout is None else timeout
        # Fast path: the route is cached and its connection is up; no timer, no retry state.
        layout = self._lookup.cached(topic, "w") if self._lookup and topic else None
        route: tuple[str, int | None] | None = None
        if layout is not None and topic is not None and not deferred:
            conn = None
            node = None
            try:
                route = address, part = self._pick(topic, partition, key, layout)
                node = self._by_address.get(address)
                conns = node.connections if node is not None else ()
                conn = min(conns, key=_pending) if conns else None
                if (
                    node is not None
                    and conn is not None
                    and conn.usable
                    and (conn.pending == 0 or len(conns) >= self._per_node)
                    and (part is None or layout.partitioned)  # else refused below
                    and (not ext or conn.features.youzan)
                ):
                    answer = await conn.request(build(part), publish=True, timeout=limit)
                    if node.failures:
                        node.mark_up()
                    return answer, address, part
            except NSQTimeout:
                if node is not None and conn is not None:
                    self._suspect(node, conn)
                raise timeout_error(limit) from None
            except (ConnectionClosed, ServerError, NoNsqdAvailable) as exc:
                self._check_retryable(exc, conn)
                route = None  # it failed: route afresh
        deadline = anyio.current_time() + limit
        try:
            # A request past the deadline raises NSQTimeout itself (and so names its
            # connection); this outer bound covers connecting and lookups.
            with anyio.fail_after(limit + 0.2):
                return await self._send_with_retries(
                    topic, build, partition, key, deferred, ext, route, deadline
                )
        except (TimeoutError, NSQTimeout):
            raise timeout_error(limit) from None

    async def _send_with_retries(
        self,
        topic: str | None,
        build: Build,
        partition: int | None,
        key: ShardingKey | None,
        deferred: bool,
        ext: bool,
        route: tuple[str, int | None] | None,
        deadline: float,
    ) -> tuple[bytes, str, int | None]:
        attempt = 0
        refresh = False
        while True:
            conn: Connection | None = None
            try:
                if self._lookup is not None and topic is not None:
                    if route is not None:  # already picked (and counted) by the fast path
                        (address, part), route = route, None
                    else:
                        address, part = await self._route(topic, partition, key, refresh)
                    node = self._node(address)
                    conn = await self._node_connection(node)
                else:
                    node, conn = await self._acquire()
                    part = partition
                check_server(conn.features, conn.address, part, deferred, ext)
                try:
                    answer = await conn.request(
                        build(part), publish=True, timeout=deadline - anyio.current_time()
                    )
                except NSQTimeout:
                    self._suspect(node, conn)
                    raise
                if node.failures:
                    node.mark_up()
                return answer, conn.address, part
            except (ConnectionClosed, NoNsqdAvailable, ServerError) as exc:
                self._check_retryable(exc, conn)
                refresh = True
                attempt += 1
                await anyio.sleep(self._next_attempt(exc, attempt))

    async def _route(
        self, topic: str, partition: int | None, key: ShardingKey | None, refresh: bool
    ) -> tuple[str, int | None]:
        """Pick the nsqd (and partition) for one publish from the write lookup."""
        assert self._lookup is not None
        layout = None if refresh else self._lookup.cached(topic, "w")
        if layout is None:
            layout = await self._lookup.refresh(topic, "w")
        return self._pick(topic, partition, key, layout)

    async def _acquire(self) -> tuple[_Node, Connection]:
        """A connection to the next healthy configured nsqd, round-robin; opens one if needed."""
        last: Exception | None = None
        for node in self._direct_candidates():
            try:
                return node, await self._node_connection(node)
            except ConnectionClosed as exc:
                last = exc
        raise NoNsqdAvailable(f"no nsqd reachable; last error: {last}") from last

    async def _node_connection(self, node: _Node) -> Connection:
        conns = [c for c in node.connections if c.usable]
        if conns:
            best = min(conns, key=_pending)
            if best.pending == 0 or len(conns) >= self._per_node:
                return best
        async with node.lock:
            conns = [c for c in node.connections if c.usable]
            if len(conns) >= self._per_node:
                return min(conns, key=_pending)
            try:
                conn = await Connection.open(node.address, self._config)
            except (ConnectionClosed, ProtocolError, InvalidArgument, ServerError) as exc:
                failure = self._open_failed(node, exc)
                if failure is exc:
                    raise
                raise failure from exc
            # Not marked up yet: only an answered request shows the node works.
            conn.on_close = lambda c: self._forget(node, c)
            node.connections.append(conn)
            assert self._tg is not None
            self._tg.start_soon(conn.run)
            return conn

    def _forget(self, node: _Node, conn: Connection) -> None:
        if conn in node.connections:
            node.connections.remove(conn)
        if not self._closed and not conn.retiring:  # lost, not closed by us
            node.mark_down(self._now())
            log.warning("connection to nsqd %s lost: %s", node.address, conn.close_reason)

    def _suspect(self, node: _Node, conn: Connection) -> None:
        """A request timed out: send nothing more through ``conn``, and avoid its nsqd."""
        node.mark_down(self._now())
        if not conn.retiring and self._tg is not None:
            log.warning(
                "nsqd %s did not answer a publish in time; avoiding it for now", node.address
            )
            self._tg.start_soon(conn.close, self.timeout)


def _pending(conn: Connection) -> int:
    return conn.pending
