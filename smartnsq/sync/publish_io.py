# Generated from smartnsq/publish_io.py by scripts/unasync.py: do not edit.
# Edit smartnsq/publish_io.py, then run `python scripts/unasync.py`.
"""The blocking twin of :mod:`smartnsq.publish_io`, generated from it: see that module."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from smartnsq._checks import FORKS, get_ident
from smartnsq.errors import (
    ConfigRefused,
    ConnectionClosed,
    LookupFailed,
    NoNsqdAvailable,
    NSQError,
    NSQTimeout,
    OutcomeUnknown,
    ServerError,
    TopicNotFound,
)
from smartnsq.lookup.model import TopicLayout
from smartnsq.ordered.sharding import ShardingKey
from smartnsq.protocol.handshake import config_refusal
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
    not_sent_error,
    timeout_error,
)
from smartnsq.sync.connection import SyncConnection

N = TypeVar("N", bound=Node[SyncConnection, Any])


class SyncPublisher(ProducerCore[N]):
    """Publishing, sending and retrying, over the front door's hooks (see the module)."""

    # Set by the front door's _setup (instance attributes only: a class attribute of the same
    # name would slow every read of them). _open: publishing is allowed; _thread, _forks: the
    # thread and fork generation a publish must come from (the blocking front door binds no
    # thread, None, so its _check_usable runs on every publish).
    _open: bool
    _thread: int | None
    _forks: int

    def _now(self) -> float:
        return time.monotonic()

    # -- the front door's hooks ------------------------------------------------------------------

    def _check_usable(self) -> None:
        """Raise when this producer may not publish from here (another thread or process,
        closed); called when the caller's thread or fork generation is not the owner's."""
        raise NotImplementedError

    def _not_open(self) -> NSQError:
        """The error for a publish while the producer is not open."""
        raise NotImplementedError

    def _bound(self, limit: float) -> AbstractContextManager[object]:
        """Around a publish's slow path (connecting, lookups, retries) of ``limit`` seconds."""
        raise NotImplementedError

    def _refresh(self, topic: str, deadline: float, everywhere: bool = False) -> TopicLayout:
        """Ask the lookupds for ``topic``'s write layout; ``everywhere``: every nsqd they
        know (``LookupManager.every_nsqd``)."""
        raise NotImplementedError

    def _node_connection(self, node: N, deadline: float) -> SyncConnection:
        """A connection to ``node``: a reusable one, or a new one."""
        raise NotImplementedError

    def _discard(self, node: N, conn: SyncConnection, close: bool, exc: Exception) -> None:
        """A request on ``conn`` failed with ``exc`` and will be retried; ``close``: close
        ``conn`` first."""
        raise NotImplementedError

    def _suspect(self, node: N, conn: SyncConnection) -> None:
        """A request timed out: send nothing more through ``conn``, and avoid its nsqd."""
        raise NotImplementedError

    # -- publishing ------------------------------------------------------------------------------

    def is_ext_topic(self, topic: str) -> bool:
        """Whether ``topic`` carries Youzan ext headers (JSON ``headers=``), as lookupd's
        topic metadata says; asked once and cached like the topic's layout.

        Args:
            topic: The topic.

        Returns:
            True for a Youzan ext topic; False for any other, for a topic no lookupd knows
            yet, and for a Producer without ``lookupd_http_addresses`` (nothing to ask).

        Raises:
            InvalidTopic: A bad topic name.
            LookupFailed: No lookupd answered.
            NSQTimeout: The lookup took longer than the Producer's ``timeout``.
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

        ``delay`` defers delivery (DPUB; classic nsqd only). On a partitioned (Youzan)
        topic, ``sharding_key`` picks the partition (same key, same partition, in order) and
        ``partition`` names one outright; otherwise partitions take turns.
        ``trace_id`` (or tracing switched on for the topic with ``producer.trace``) sends a
        traced publish and returns a [`PublishResult`][smartnsq.PublishResult]; ``headers``
        sends the JSON ext header of an ext topic. Plain publishes return ``None``.
        On a connection failure before it was sent, or a server error that is safe to
        retry, it is retried (up to ``max_retries``, within ``timeout``), on another nsqd
        when there is one; once sent, it is never sent again.

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
            tag: dispatch tag of the message (Youzan ext topics): only consumers whose
                ``desired_tag`` is the same receive it (untagged consumers while none is
                connected). 1-100 ASCII letters, digits, ``_`` or ``-``; sent as the ext
                header ``##client_dispatch_tag``. A topic that is not an ext topic refuses
                it with [`ExtNotSupported`][smartnsq.errors.ExtNotSupported].

        Returns:
            A [`PublishResult`][smartnsq.PublishResult] (partition, internal id, offset) for
                a traced publish, else None.

        Raises:
            NSQTimeout: No answer within ``timeout``: the message may or may not have been
                published (nsqd may store it, even later); it is not sent again.
            OutcomeUnknown: The connection ended after the message was sent and before
                nsqd's answer: it may or may not have been published; it is not sent again.
            MessageTooLarge: ``body`` is larger than ``max_message_size``; nothing was sent.
            InvalidArgument: A bad argument (an empty body, a delay out of range, a
                partition that does not exist); nothing was sent.
            InvalidType: An argument of the wrong type; nothing was sent.
            NotSupported: ``delay`` on a Youzan nsqd, or ``partition`` on a classic one;
                nothing was sent.
            NoNsqdAvailable: No nsqd could take the message (all down, or none listed), or
                ``timeout`` ran out before it was sent ("publish not sent"): nothing was
                sent, publishing it again is safe.
            TopicNotFound: With ``lookupd_http_addresses`` on the Youzan fork: no lookupd
                knows the topic (an operator creates topics there). On a classic cluster a
                new topic goes to one of the nsqd the lookupds know, which creates it.
            ServerError: nsqd refused the message and a retry cannot help (or the retries
                ran out).
            ConnectionClosed: The connection failed before the message was sent and the
                retries ran out.
        """
        if self._thread != get_ident() or self._forks != FORKS[0]:
            self._check_usable()
        plan = self._plan_publish(
            topic, body, delay, partition, sharding_key, trace_id, headers, timeout, tag
        )
        try:
            if type(plan) is bytes:
                self._send(plan, timeout)
                return None
            assert isinstance(plan, Request)
            answer, address, part = self._send_routed(
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

        Batches go out in order, all to one partition. If one fails after earlier ones
        succeeded, [`PartialPublish`][smartnsq.errors.PartialPublish] says how many messages were
        acknowledged. With ``trace_ids`` (one per message; generated when tracing is on for the
        topic) it sends MPUB_TRACE and returns one [`PublishResult`][smartnsq.PublishResult]
        per batch.

        Args:
            topic: The topic (NSQ's naming rules).
            bodies: The messages, an iterable of bytes-like objects (at least one; each
                non-empty and at most ``max_message_size`` bytes). Split into as few MPUBs
                as fit ``max_body_size``.
            partition: Youzan: the partition to publish to.
            sharding_key: Youzan: a key that picks the partition (see
                [`publish`][smartnsq.Producer.publish]); every message goes to it.
            trace_ids: Youzan: one trace id per message; the batches go out as
                ``MPUB_TRACE``.
            timeout: Seconds each batch may take, retries included; default: the
                Producer's ``timeout``.
            tags: one dispatch tag (or ``None``) per message, as ``trace_ids`` gives one
                trace id per message; sent with MPUB_EXT (see ``tag`` of ``publish``).
                Cannot be combined with ``trace_ids``.
            headers: Youzan ext topics: the JSON ext header of every message (one mapping),
                or one mapping (or ``None``) per message; sent with MPUB_EXT. Cannot be
                combined with ``trace_ids``.

        Returns:
            For a traced publish (``trace_ids`` given, or tracing on for the topic), one
                [`PublishResult`][smartnsq.PublishResult] per batch (ids and offset of its
                first message); else None.

        Raises:
            PartialPublish: A later batch failed after earlier ones were acknowledged:
                ``published`` says how many messages were.
            NSQTimeout: No answer within ``timeout``: the failed batch may or may not have
                been published; it is not sent again.
            OutcomeUnknown: The connection ended after the batch was sent and before nsqd's
                answer: it may or may not have been published; it is not sent again.
            MessageTooLarge: A body is larger than ``max_message_size``; nothing was sent.
            InvalidArgument: A bad argument (no message, an empty body, a wrong number of
                trace ids); nothing was sent.
            InvalidType: An argument of the wrong type (a single body instead of a list);
                nothing was sent.
            NoNsqdAvailable: No nsqd could take the batch, or ``timeout`` ran out before
                it was sent ("publish not sent"): publishing it again is safe.
            TopicNotFound: As for [`publish`][smartnsq.Producer.publish].
            ServerError: nsqd refused the first batch and a retry cannot help.
            ConnectionClosed: The connection failed before the message was sent and the
                retries ran out.
        """
        if self._thread != get_ident() or self._forks != FORKS[0]:
            self._check_usable()
        plan = self._plan_many(
            topic, bodies, partition, sharding_key, trace_ids, timeout, tags, headers
        )
        if type(plan) is bytes:
            count = len(bodies) if type(bodies) is list else mpub_count(topic, plan)
            try:
                self._send(plan, timeout, count)
            except NSQError:
                self._failed += count
                raise
            return None
        assert not isinstance(plan, bytes)
        run = BatchRun(self, topic, plan)
        for request in plan.requests:
            try:
                if plan.routed:
                    sent = self._send_routed(
                        topic,
                        request.build,
                        partition,
                        sharding_key,
                        timeout,
                        count=request.count,
                        ext=request.ext,
                    )
                else:  # plain batches: no route, no answer to read
                    sent = self._send(request.build(None), timeout, request.count), "", None
            except NSQError as exc:
                raise run.failed(exc)  # noqa: B904 - it sets the cause
            run.answered(request, *sent)
        return run.results()

    # -- internals -------------------------------------------------------------------------------

    def _send(self, data: bytes, timeout: float | None, count: int = 1) -> bytes:
        """Plain publish of ``count`` messages to the configured nsqd (no routing): the fast
        path."""
        if not self._open:
            raise self._not_open()
        limit = self.timeout if timeout is None else timeout
        spent = 0.0
        conn = self._ready_connection()
        if conn is not None:
            node = self._direct[0]
            start = conn.clock()
            try:
                answer = conn.request(data, publish=True, timeout=limit)
            except NSQTimeout:
                self._suspect(node, conn)
                raise timeout_error(limit) from None
            except (ConnectionClosed, ServerError) as exc:
                node.errors += 1
                self._check_retryable(exc, node, conn)
                self._retried += 1  # by the slow path below
                spent = conn.clock() - start  # the call's timeout covers its retries too
            else:
                node.answered(count)
                return answer
        answer, _, _ = self._send_routed(
            None, lambda p: data, None, None, timeout, count=count, spent=spent
        )
        return answer

    def _ready_connection(self) -> SyncConnection | None:
        return self._direct[0].reusable(self._per_node) if len(self._direct) == 1 else None

    def _check_retryable(self, exc: Exception, node: N | None, conn: SyncConnection | None) -> None:
        if isinstance(exc, OutcomeUnknown):
            # Sent, and the connection ended before the answer: nsqd may hold it already, so
            # sending it again could store it twice.
            if node is not None and conn is not None:
                self._discard(node, conn, False, exc)
            raise exc
        if isinstance(exc, ConfigRefused):  # the same settings fail the same way again
            raise exc
        if isinstance(exc, ServerError) and conn is not None:  # say, TLS that nsqd requires
            refused = config_refusal(exc, conn.address, handshake=False)
            if refused is not None:
                raise refused
        close = self._retry_action(exc)  # raises when it may not be retried
        if node is not None and conn is not None:
            self._discard(node, conn, close, exc)

    def _send_routed(
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
        spent: float = 0.0,
    ) -> tuple[bytes, str, int | None]:
        """Route, send, retry ``count`` messages. Returns (answer, nsqd address, partition).

        ``spent``: seconds of the call's timeout a failed first attempt already used."""
        if not self._open:
            raise self._not_open()
        limit = self.timeout if timeout is None else timeout
        left = limit - spent
        # Fast path: the route is cached and its connection is up; no timer, no retry state.
        layout = self._lookup.cached(topic, "w") if self._lookup and topic else None
        route: tuple[str, int | None] | None = None
        if layout is not None and topic is not None and not deferred:
            conn = None
            node = None
            start = 0.0
            try:
                route = address, part = self._pick(topic, partition, key, layout)
                node = self._by_address.get(address)
                conn = node.reusable(self._per_node) if node is not None else None
                if (
                    node is not None
                    and conn is not None
                    and (part is None or layout.partitioned)  # else refused below
                    and (not ext or conn.features.youzan)
                ):
                    start = conn.clock()
                    answer = conn.request(build(part), publish=True, timeout=left)
                    node.answered(count)
                    return answer, address, part
            except NSQTimeout:
                if node is not None and conn is not None:
                    self._suspect(node, conn)
                raise timeout_error(limit) from None
            except (ConnectionClosed, ServerError, NoNsqdAvailable) as exc:
                sent = node is not None and conn is not None
                if node is not None and sent:
                    node.errors += 1
                self._check_retryable(exc, node, conn)
                if sent and conn is not None:  # the slow path below sends it again
                    self._retried += 1
                    left -= conn.clock() - start
                route = None  # it failed: route afresh
        if left <= 0.0:  # the first attempt failed (unstored) and used the call's time up
            raise not_sent_error(limit, None)
        deadline = time.monotonic() + left
        # Whether the current attempt's request went out (nsqd may hold it): a timeout
        # before that (connecting, a lookup, a retry's wait) can say nothing was sent.
        went_out = [False]
        try:
            # Each step is bounded by the deadline; a front door may add an outer bound (the
            # event loop's covers connecting and lookups).
            with self._bound(left):
                return self._send_with_retries(
                    topic, build, partition, key, deferred, ext, route, deadline, count, went_out
                )
        except (TimeoutError, NSQTimeout) as exc:
            if not went_out[0]:
                raise not_sent_error(limit, exc) from None
            raise timeout_error(limit) from None

    def _send_with_retries(
        self,
        topic: str | None,
        build: Build,
        partition: int | None,
        key: ShardingKey | None,
        deferred: bool,
        ext: bool,
        route: tuple[str, int | None] | None,
        deadline: float,
        count: int,
        went_out: list[bool],
    ) -> tuple[bytes, str, int | None]:
        attempt = 0
        refresh = False
        while True:
            if attempt:
                self._retried += 1
            conn: SyncConnection | None = None
            node: N | None = None
            try:
                if self._lookup is not None and topic is not None:
                    if route is not None:  # already picked (and counted) by the fast path
                        (address, part), route = route, None
                    else:
                        layout = self._layout(topic, refresh, deadline)
                        if self._all_down(layout):
                            layout = self._elsewhere(topic, layout, deadline)
                        address, part = self._pick(topic, partition, key, layout)
                    node = self._node(address)
                    conn = self._node_connection(node, deadline)
                else:
                    node, conn = self._acquire(deadline)
                    part = partition
                check_server(conn.features, conn.address, part, deferred, ext)
                wait = deadline - time.monotonic()
                if wait <= 0.0:  # nothing sent: no time left to wait for an answer
                    raise NSQTimeout("no time left to send")
                went_out[0] = True
                try:
                    answer = conn.request(build(part), publish=True, timeout=wait)
                except (ConnectionClosed, ServerError):
                    node.errors += 1
                    raise
                node.answered(count)
                return answer, conn.address, part
            except NSQTimeout:
                if node is not None and conn is not None:
                    self._suspect(node, conn)
                raise
            except (ConnectionClosed, NoNsqdAvailable, ServerError) as exc:
                self._check_retryable(exc, node, conn)  # raises when nsqd may hold it
                went_out[0] = False
                refresh = True
                attempt += 1
                pause = self._next_attempt(exc, attempt)
                if time.monotonic() + pause >= deadline:
                    raise NSQTimeout("no time left to retry") from exc
                time.sleep(pause)

    def _layout(self, topic: str, refresh: bool, deadline: float) -> TopicLayout:
        """The topic's write layout: cached, or asked of the lookupds."""
        assert self._lookup is not None
        layout = None if refresh else self._lookup.cached(topic, "w")
        if layout is None:
            layout = self._refresh(topic, deadline)
        return layout

    def _elsewhere(self, topic: str, layout: TopicLayout, deadline: float) -> TopicLayout:
        """Every nsqd listed for classic ``topic`` is down: every nsqd lookupd knows, where
        nsqd creates the topic on its first PUB (consumers through lookupd find it there
        too). On the fork, or when lookupd cannot say, the topic's own nsqd."""
        try:
            return self._refresh(topic, deadline, everywhere=True)
        except (TopicNotFound, LookupFailed):
            return layout

    def _acquire(self, deadline: float) -> tuple[N, SyncConnection]:
        """A connection to the next healthy configured nsqd, round-robin; opens one if needed."""
        last: Exception | None = None
        refused: ConfigRefused | None = None
        for node in self._direct_candidates():
            try:
                return node, self._node_connection(node, deadline)
            except ConnectionClosed as exc:
                last = exc
                if isinstance(exc, ConfigRefused):
                    refused = exc
        if refused is not None:  # the others cannot be reached: this is what to fix
            raise refused
        raise NoNsqdAvailable(f"no nsqd reachable; last error: {last}") from last

    def _check_settings(self) -> None:
        """On entry: connect to the configured nsqd, one after the other until one answers
        (within a connection's and a handshake's timeout in all), so that settings nsqd
        refuses fail the start. One that cannot be reached is left to the publishes.

        Raises:
            ConfigRefused: An nsqd refused the settings.
        """
        config = self._config
        limit = config.connect_timeout + config.handshake_timeout
        deadline = time.monotonic() + limit
        for node in self._direct:
            if time.monotonic() >= deadline:
                return
            try:
                with self._bound(limit):
                    self._node_connection(node, deadline)
            except ConfigRefused:
                raise
            except (NSQError, OSError, TimeoutError):
                continue  # reconnecting can fix it: the publishes try again
            return
