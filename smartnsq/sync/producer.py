"""The blocking publishing front door: :class:`Producer` for plain threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import anyio

from smartnsq._checks import FORKS
from smartnsq.errors import (
    ConnectionClosed,
    InvalidArgument,
    NoNsqdAvailable,
    NSQError,
    NSQTimeout,
    ProtocolError,
    ServerError,
    UsedAfterFork,
)
from smartnsq.lookup.manager import LookupManager
from smartnsq.lookup.model import TopicLayout
from smartnsq.ordered.sharding import ShardingKey
from smartnsq.protocol.message import PublishResult
from smartnsq.publishing import (
    Build,
    NodeHealth,
    ProducerCore,
    Request,
    batch_failed,
    check_server,
    mpub_count,
    timeout_error,
)
from smartnsq.sync.connection import SyncConnection


class _Node(NodeHealth):
    """One nsqd: its health and its connections."""

    __slots__ = ("connections", "lock")

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.connections: list[SyncConnection] = []
        self.lock = threading.Lock()

    def load(self) -> tuple[int, int]:
        conns = self.connections  # replaced, never changed in place
        return len(conns), sum(c.pending for c in conns)


class Producer(ProducerCore[_Node]):
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

    Args:
        nsqd_tcp_addresses: nsqd TCP addresses (``host:port``) to publish to; publishes take
            turns over the healthy ones. May be passed positionally.
        lookupd_http_addresses: nsqlookupd HTTP addresses (``host:port`` or an ``http(s)://``
            URL). With them, each topic's nsqd (on Youzan, its partitions and their leaders)
            come from the lookupds; the topic must exist. At least one of
            ``nsqd_tcp_addresses`` and ``lookupd_http_addresses`` is required.
        lookupd_poll_interval: How long a topic's lookup answer is reused before the lookupds
            are asked again (with some jitter), in seconds, default 60.0. Cluster errors
            (a partition moved, its leader changed) refresh it at once.
        sharding: How a ``sharding_key`` maps to a Youzan partition: ``"go"`` (default;
            go-nsq's MurmurHash3 mapping), ``"java"`` (the Java SDK's ``hashCode`` mapping) or
            a callable ``(key, partition_count) -> partition``.
        connections_per_nsqd: Most connections opened to one nsqd, an int >= 1, default 1.
            Requests are pipelined on each; more connections help only when one is
            saturated.
        timeout: Seconds a publish may take, retries included, unless the call gives its own
            ``timeout``; default 10.0. When it runs out,
            [`NSQTimeout`][smartnsq.errors.NSQTimeout] says the outcome is unknown.
        max_retries: Retries after a failure that is safe to retry (a broken connection, a
            retryable server error), an int >= 0, default 3; on another nsqd when there is
            one.
        retry_backoff: Wait before the first retry, in seconds, default 0.05; it doubles
            with each retry (plus up to 50 % at random).
        max_message_size: Largest message body accepted, in bytes, default 1 MiB (nsqd's
            ``--max-msg-size`` default); larger bodies raise
            [`MessageTooLarge`][smartnsq.errors.MessageTooLarge] before anything is sent.
        max_body_size: Largest MPUB body, in bytes, default 5 MiB (nsqd's
            ``--max-body-size`` default); ``publish_many`` splits its batch to fit. At least
            ``max_message_size + 8``.
        tls: ``True`` for TLS with the system's trusted certificates and host name
            verification, an ``ssl.SSLContext`` for your own settings (client certificates, a
            private CA), ``False`` (default) for plain TCP.
        tls_hostname: Name the server certificate is checked against; default: the host of
            the nsqd address.
        snappy: Compress connections with Snappy. Default False.
        deflate: Compress connections with DEFLATE (not together with ``snappy``). Default
            False.
        deflate_level: DEFLATE level, 1 to 9, default 6.
        auth_secret: Secret sent with AUTH when nsqd requires authentication. Without TLS it
            is readable on the network: a warning is given once per process (see
            ``auth_over_plaintext``).
        heartbeat_interval: How often nsqd sends a heartbeat, in seconds: 1 to 60, or -1 to
            disable; default 30.0. A connection silent for two intervals (plus 10 %) is
            closed and its nsqd avoided for a while.
        connect_timeout: Seconds allowed for the TCP connection to an nsqd, default 5.0.
        client_id: Client id reported to nsqd (shown in its stats); default: the short host
            name.
        identify: Extra fields for the IDENTIFY command (a dict of JSON values), sent as
            they are. Default None.
        max_delay: Longest ``delay`` [`publish`][smartnsq.sync.Producer.publish] accepts, in
            seconds, default 3600.0 (classic nsqd's default ``--max-req-timeout``); raise it
            when your nsqd allows more.
        auth_over_plaintext: ``False`` refuses to send ``auth_secret`` to an nsqd that asks
            for it over an unencrypted connection: the connection fails with
            [`InsecureAuth`][smartnsq.errors.InsecureAuth]. Default True.
        compress_topics: ext topics whose large bodies it compresses, as go-nsq does; see
            [`smartnsq.Producer`][smartnsq.Producer].
        compress_codec: ``"snappy"`` (default), ``"gzip"`` or ``"lz4"``.
        compress_min_size: smallest body compressed, in bytes (default 20480).
        busy_poll: Longest time, in seconds, a publish alone in flight on its connection
            polls for nsqd's answer before the thread sleeps on it; default 0.0005, 0 turns
            it off. See [`smartnsq.Producer`][smartnsq.Producer].

    Raises:
        InvalidArgument: A value is out of range, or neither ``nsqd_tcp_addresses`` nor
            ``lookupd_http_addresses`` was given.
        InvalidType: A value has the wrong type.

    Attributes:
        trace: Run-time trace switch ([`TraceSwitch`][smartnsq.trace.TraceSwitch]): while
            tracing is on for a topic, every publish to it is traced (a trace id is generated
            when none is given) and written as a ``publish`` trace record.
    """

    def _setup(self) -> None:
        self._lookup = (
            LookupManager(self._lookupds, cache_ttl=self._poll_interval) if self._lookupds else None
        )
        self._lookup_lock = threading.Lock()
        self._forks = FORKS[0]
        self._closed = False

    def _new_node(self, address: str) -> _Node:
        return _Node(address)

    def _now(self) -> float:
        return time.monotonic()

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Wait (briefly) for outstanding answers, then close every connection.

        ``with`` calls it on exit; calling it again does nothing.
        """
        if self._closed:
            return
        self._closed = True
        for node in list(self._by_address.values()):
            for conn in list(node.connections):
                conn.close()

    def _check_usable(self) -> None:
        if self._closed:
            raise NSQError("this Producer is closed")
        if self._forks != FORKS[0]:  # cheaper than os.getpid() on every publish
            raise UsedAfterFork(
                "this Producer was created in the parent process and cannot be used after "
                "fork(): its connections belong to the parent; create a new Producer in the child"
            )

    # -- publishing ------------------------------------------------------------------------------

    def publish(
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

        The same as [`smartnsq.Producer.publish`][smartnsq.Producer.publish], blocking.

        Args:
            topic: The topic (NSQ's naming rules).
            body: The message: bytes or any other bytes-like object (bytearray,
                memoryview, ...); its bytes are sent. Not empty, at most
                ``max_message_size`` bytes.
            delay: Seconds before nsqd delivers it (DPUB; classic nsqd only), at most the
                Producer's ``max_delay``. Not combined with ``trace_id`` or ``headers``.
            partition: Youzan: the partition to publish to.
            sharding_key: Youzan: a key (bytes, str or int) that picks the partition with the
                Producer's ``sharding`` mapping: the same key always goes to the same
                partition, so its messages keep their order.
            trace_id: Youzan: publish traced (``PUB_TRACE``) with this trace id (an int in
                ``[0, 2**64)``) and return a [`PublishResult`][smartnsq.PublishResult].
            headers: Youzan ext topics: the JSON ext header (a mapping of JSON values),
                sent with ``PUB_EXT``.
            timeout: Seconds this call may take, retries included; default: the Producer's
                ``timeout``.
            tag: dispatch tag of the message on a Youzan ext topic (see
                [`publish`][smartnsq.Producer.publish]).

        Returns:
            A [`PublishResult`][smartnsq.PublishResult] (partition, internal id, offset) for
                a traced publish, else None.

        Raises:
            NSQTimeout: No answer within ``timeout``: the message may or may not have been
                published.
            MessageTooLarge: ``body`` is larger than ``max_message_size``; nothing was sent.
            InvalidArgument: A bad argument (an empty body, a delay out of range, a
                partition that does not exist); nothing was sent.
            InvalidType: An argument of the wrong type; nothing was sent.
            NotSupported: ``delay`` on a Youzan nsqd, or ``partition`` on a classic one;
                nothing was sent.
            NoNsqdAvailable: No nsqd could take the message (all down, or none listed).
            ServerError: nsqd refused the message and a retry cannot help (or the retries
                ran out).
            ConnectionClosed: The connection failed and the retries ran out.
        """
        self._check_usable()
        plan = self._plan_publish(
            topic, body, delay, partition, sharding_key, trace_id, headers, timeout, tag
        )
        try:
            if type(plan) is bytes:
                data = plan
                self._send(None, lambda p: data, None, None, timeout)
                return None
            assert isinstance(plan, Request)
            answer, address, part = self._send(
                topic,
                plan.build,
                partition,
                sharding_key,
                timeout,
                deferred=plan.deferred,
                ext=plan.ext,
            )
        except NSQError:
            self._failed += 1
            raise
        return self._result(topic, plan, answer, address, part)

    def publish_many(
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

        The same as [`smartnsq.Producer.publish_many`][smartnsq.Producer.publish_many],
        blocking.

        Args:
            topic: The topic (NSQ's naming rules).
            bodies: The messages, an iterable of bytes-like objects (at least one; each
                non-empty and at most ``max_message_size`` bytes). Split into as few MPUBs
                as fit ``max_body_size``.
            partition: Youzan: the partition to publish to.
            sharding_key: Youzan: a key that picks the partition (see
                [`publish`][smartnsq.sync.Producer.publish]); every message goes to it.
            trace_ids: Youzan: one trace id per message; the batches go out as
                ``MPUB_TRACE``.
            timeout: Seconds each batch may take, retries included; default: the
                Producer's ``timeout``.
            tags: one dispatch tag (or ``None``) per message (MPUB_EXT).

        Returns:
            For a traced publish (``trace_ids`` given, or tracing on for the topic), one
                [`PublishResult`][smartnsq.PublishResult] per batch (ids and offset of its
                first message); else None.

        Raises:
            PartialPublish: A later batch failed after earlier ones were acknowledged:
                ``published`` says how many messages were.
            NSQTimeout: No answer within ``timeout``: the failed batch may or may not have
                been published.
            MessageTooLarge: A body is larger than ``max_message_size``; nothing was sent.
            InvalidArgument: A bad argument (no message, an empty body, a wrong number of
                trace ids); nothing was sent.
            InvalidType: An argument of the wrong type (a single body instead of a list);
                nothing was sent.
            NoNsqdAvailable: No nsqd could take the batch.
            ServerError: nsqd refused the first batch and a retry cannot help.
            ConnectionClosed: The connection failed and the retries ran out.
        """
        self._check_usable()
        plan = self._plan_many(topic, bodies, partition, sharding_key, trace_ids, timeout, tags)
        if type(plan) is bytes:
            data = plan
            count = len(bodies) if type(bodies) is list else mpub_count(topic, data)
            try:
                self._send(None, lambda p: data, None, None, timeout, count=count)
            except NSQError:
                self._failed += count
                raise
            return None
        assert not isinstance(plan, bytes)
        results: list[PublishResult] = []
        done = 0
        for request in plan.requests:
            try:
                answer, address, part = self._send(
                    topic if plan.routed else None,
                    request.build,
                    partition,
                    sharding_key,
                    timeout,
                    count=request.count,
                    ext=request.ext,
                )
            except NSQError as exc:
                self._failed += plan.total - done
                raise batch_failed(exc, done, plan.total)  # noqa: B904 - it sets the cause
            result = self._result(topic, request, answer, address, part)
            if result is not None:
                results.append(result)
            done += request.count
        return results if plan.traced else None

    # -- internals -------------------------------------------------------------------------------

    def _send(
        self,
        topic: str | None,
        build: Build,
        partition: int | None,
        key: ShardingKey | None,
        timeout: float | None,
        *,
        deferred: bool = False,
        count: int = 1,
        ext: bool = False,
    ) -> tuple[bytes, str, int | None]:
        """Route (by lookup when ``topic`` is given), send ``count`` messages, retry;
        (answer, nsqd, partition)."""
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        attempt = 0
        refresh = False
        while True:
            if attempt:
                self._retried += 1
            conn: SyncConnection | None = None
            node: _Node | None = None
            try:
                if self._lookup is not None and topic is not None:
                    address, part = self._pick(
                        topic, partition, key, self._layout(topic, refresh, deadline)
                    )
                    node = self._node(address)
                    conn = self._node_connection(node, deadline)
                else:
                    node, conn = self._acquire(deadline)
                    part = partition
                check_server(conn.features, conn.address, part, deferred, ext)
                try:
                    answer = conn.request(build(part), max(0.0, deadline - time.monotonic()))
                except (ConnectionClosed, ServerError):
                    node.errors += 1
                    raise
                node.requests += 1
                node.published += count
                if node.failures:
                    node.mark_up()
                return answer, conn.address, part
            except NSQTimeout:
                if node is not None and conn is not None:
                    self._suspect(node, conn)
                raise timeout_error(limit) from None
            except (ConnectionClosed, NoNsqdAvailable, ServerError) as exc:
                if self._retry_action(exc) and conn is not None:
                    conn.close(0.0)
                if isinstance(exc, ConnectionClosed) and node is not None and conn is not None:
                    self._forget(node, conn)
                refresh = True
                attempt += 1
                pause = self._next_attempt(exc, attempt)
                if time.monotonic() + pause >= deadline:
                    raise timeout_error(limit) from exc
                time.sleep(pause)

    def _layout(self, topic: str, refresh: bool, deadline: float) -> TopicLayout:
        """The topic's write layout: cached, or asked of the lookupds (one thread at a time)."""
        assert self._lookup is not None
        lookup = self._lookup
        layout = None if refresh else lookup.cached(topic, "w")
        if layout is not None:
            return layout
        if not self._lookup_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise NSQTimeout("waited too long for another thread's lookup")
        try:

            async def ask() -> TopicLayout:
                async with lookup:
                    with anyio.fail_after(max(0.0, deadline - time.monotonic())):
                        return await lookup.refresh(topic, "w")

            try:
                return anyio.run(ask)
            except TimeoutError:
                raise NSQTimeout(f"lookup of {topic!r} did not finish in time") from None
        finally:
            self._lookup_lock.release()

    def _acquire(self, deadline: float) -> tuple[_Node, SyncConnection]:
        """A connection to the next healthy configured nsqd, round-robin; opens one if needed."""
        if len(self._direct) == 1:  # the usual case: no turns to take
            node = self._direct[0]
            return node, self._node_connection(node, deadline)
        last: Exception | None = None
        for node in self._direct_candidates():
            try:
                return node, self._node_connection(node, deadline)
            except ConnectionClosed as exc:
                last = exc
        raise NoNsqdAvailable(f"no nsqd reachable; last error: {last}") from last

    def _node_connection(self, node: _Node, deadline: float) -> SyncConnection:
        conns = node.connections
        if len(conns) == 1:  # the usual case: one idle connection, nothing to compare
            conn = conns[0]
            if not conn.pending and conn.usable:
                return conn
        conns = [c for c in conns if c.usable]
        if conns:
            best = min(conns, key=_pending)
            if best.pending == 0 or len(conns) >= self._per_node:
                return best
        if not node.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise NSQTimeout(f"waited too long for a connection to nsqd {node.address}")
        try:
            conns = [c for c in node.connections if c.usable]
            if len(conns) >= self._per_node:
                return min(conns, key=_pending)
            if self._closed:
                raise NSQError("this Producer is closed")
            try:
                conn = SyncConnection.open(
                    node.address, self._config, max(0.001, deadline - time.monotonic())
                )
            except (ConnectionClosed, ProtocolError, InvalidArgument, ServerError) as exc:
                failure = self._open_failed(node, exc)
                if failure is exc:
                    raise
                raise failure from exc
            self._connected(node)
            node.connections = [*conns, conn]
            return conn
        finally:
            node.lock.release()

    def _forget(self, node: _Node, conn: SyncConnection) -> None:
        """A connection broke: drop it, and avoid its nsqd for a while."""
        if conn in node.connections:
            node.connections = [c for c in node.connections if c is not conn]
            node.mark_down(self._now(), f"connection lost: {conn.close_reason}")

    def _suspect(self, node: _Node, conn: SyncConnection) -> None:
        """A request timed out: send nothing more through ``conn``, and avoid its nsqd."""
        node.errors += 1
        node.mark_down(self._now(), "did not answer a publish in time")
        if conn in node.connections:
            node.connections = [c for c in node.connections if c is not conn]
            # Its other requests fail at once and are retried elsewhere within their time.
            conn.close(0.0)


def _pending(conn: SyncConnection) -> int:
    return conn.pending
