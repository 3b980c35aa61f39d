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
    NoNsqdAvailable,
    NSQError,
    NSQTimeout,
    ServerError,
    TopicNotFound,
    UsedAfterFork,
)
from smartnsq.lookup.model import TopicLayout
from smartnsq.ordered.sharding import ShardingKey
from smartnsq.protocol.message import PublishResult
from smartnsq.publish_plan import ManyHeaders
from smartnsq.publishing import (
    BatchRun,
    Build,
    Node,
    ProducerCore,
    Request,
    check_server,
    mpub_count,
    timeout_error,
)
from smartnsq.sync.connection import SyncConnection

_Node = Node[SyncConnection, threading.Lock]


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
    """

    def _setup(self) -> None:
        self._lookup_lock = threading.Lock()
        self._forks = FORKS[0]

    def _new_node(self, address: str) -> _Node:
        return Node(address, threading.Lock())

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

    def is_ext_topic(self, topic: str) -> bool:
        """Whether ``topic`` carries Youzan ext headers (see
        [`smartnsq.Producer.is_ext_topic`][smartnsq.Producer.is_ext_topic]); the lookup takes
        at most the Producer's ``timeout``.

        Args:
            topic: The topic.

        Returns:
            True for a Youzan ext topic, else False.

        Raises:
            InvalidTopic: A bad topic name.
            LookupFailed: No lookupd answered.
            NSQTimeout: The lookup took longer than ``timeout``.
        """
        self._check_topic(topic)
        if self._lookup is None:
            return False
        try:
            layout = self._layout(topic, False, time.monotonic() + self.timeout)
        except TopicNotFound:
            return False
        return self._ext_layout(layout)

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

        The same as [`smartnsq.Producer.publish`][smartnsq.Producer.publish], blocking:
        the details of each argument and error are there.

        Args:
            topic: The topic.
            body: The message (bytes-like, not empty, at most ``max_message_size`` bytes).
            delay: Seconds before nsqd delivers it (DPUB; classic nsqd only).
            partition: Youzan: the partition to publish to.
            sharding_key: Youzan: a key that picks the partition.
            trace_id: Youzan: publish traced with this trace id.
            headers: Youzan ext topics: the JSON ext header.
            tag: Youzan ext topics: the message's dispatch tag.
            timeout: Seconds this call may take, retries included.

        Returns:
            A [`PublishResult`][smartnsq.PublishResult] for a traced publish, else None.

        Raises:
            NSQError: What [`smartnsq.Producer.publish`][smartnsq.Producer.publish] raises:
                ``NSQTimeout`` (outcome unknown), ``MessageTooLarge``, ``InvalidArgument``,
                ``InvalidType``, ``NotSupported`` (nothing was sent), ``NoNsqdAvailable``,
                ``ServerError``, ``ConnectionClosed``.
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
        headers: ManyHeaders = None,
    ) -> list[PublishResult] | None:
        """Publish several messages with MPUB, split into as few batches as nsqd accepts.

        The same as [`smartnsq.Producer.publish_many`][smartnsq.Producer.publish_many],
        blocking: the details of each argument and error are there.

        Args:
            topic: The topic.
            bodies: The messages (bytes-like, at least one).
            partition: Youzan: the partition to publish to.
            sharding_key: Youzan: a key that picks the partition for all of them.
            trace_ids: Youzan: one trace id per message (MPUB_TRACE).
            tags: one dispatch tag (or ``None``) per message (MPUB_EXT).
            timeout: Seconds each batch may take, retries included.
            headers: Youzan ext topics: one JSON ext header for every message, or one (or
                ``None``) per message (MPUB_EXT).

        Returns:
            For a traced publish, one [`PublishResult`][smartnsq.PublishResult] per batch;
                else None.

        Raises:
            NSQError: What [`smartnsq.Producer.publish_many`][smartnsq.Producer.publish_many]
                raises: ``PartialPublish`` (``published`` says how many were acknowledged),
                ``NSQTimeout``, ``MessageTooLarge``, ``InvalidArgument``, ``InvalidType``,
                ``NoNsqdAvailable``, ``ServerError``, ``ConnectionClosed``.
        """
        self._check_usable()
        plan = self._plan_many(
            topic, bodies, partition, sharding_key, trace_ids, timeout, tags, headers
        )
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
        run = BatchRun(self, topic, plan)
        for request in plan.requests:
            try:
                sent = self._send(
                    topic if plan.routed else None,
                    request.build,
                    partition,
                    sharding_key,
                    timeout,
                    count=request.count,
                    ext=request.ext,
                )
            except NSQError as exc:
                raise run.failed(exc)  # noqa: B904 - it sets the cause
            run.answered(request, *sent)
        return run.results()

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
                node.answered(count)
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

    def _suspect(self, node: _Node, conn: SyncConnection) -> None:
        """A request timed out: send nothing more through ``conn``, and avoid its nsqd."""
        self._timed_out(node)
        if node.drop(conn):
            # Its other requests fail at once and are retried elsewhere within their time.
            conn.close(0.0)
