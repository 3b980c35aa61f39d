# Generated from smartnsq/producer/io.py by scripts/unasync.py: do not edit.
# Edit smartnsq/producer/io.py, then run `python scripts/unasync.py`.
"""The blocking twin of :mod:`smartnsq.producer.io`, generated from it: see that module."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from smartnsq._checks import FORKS, get_ident
from smartnsq.errors import (
    ConfigRefused,
    ConnectionClosed,
    LookupFailed,
    NoNsqdAvailable,
    NSQError,
    NSQTimeout,
    OutcomeUnknown,
    Retry,
    ServerError,
    TopicNotFound,
)
from smartnsq.lookup.model import TopicLayout
from smartnsq.ordered.sharding import ShardingKey
from smartnsq.producer.nodes import check_server
from smartnsq.producer.plan import (
    BatchRun,
    Build,
    ManyHeaders,
    Plan,
    Request,
    mpub_count,
    not_sent_error,
    timeout_error,
)
from smartnsq.producer.settings import Settings
from smartnsq.protocol.handshake import config_refusal
from smartnsq.protocol.message import PublishResult
from smartnsq.stats import ProducerStats

if TYPE_CHECKING:  # the blocking twin's are imported by smartnsq.sync: no circle at run time
    from smartnsq.net.blocking import SyncConnection
    from smartnsq.producer.links_sync import SyncLinkNode, SyncLinks

log = logging.getLogger("smartnsq.producer")


class SyncPublisher:
    """Publishing, sending and retrying over the producer's parts (see the module)."""

    def __init__(self, settings: Settings, plan: Plan, links: SyncLinks) -> None:
        self._plan = plan
        self._links = links
        self._nodes = nodes = links.nodes
        # The same objects as the parts': read here without a hop on every publish.
        self._direct = nodes.direct
        self._by_address = nodes.by_address
        self._per_node = nodes.per_node
        self._lookup = links.lookup
        self._config = settings.config
        self._timeout = settings.timeout
        self._max_retries = settings.max_retries
        self._retry_backoff = settings.retry_backoff
        self._failed = 0  # messages of calls that raised
        self._retried = 0  # requests sent again

    def stats(self) -> ProducerStats:
        return self._nodes.stats(self._failed, self._retried)

    # -- publishing ------------------------------------------------------------------------------

    def is_ext_topic(self, topic: str) -> bool:
        """Whether ``topic`` carries Youzan ext headers (see the front door)."""
        self._plan.check_topic(topic)
        if self._lookup is None:
            return False
        try:
            layout = self._layout(topic, False, time.monotonic() + self._timeout)
        except TopicNotFound:
            return False
        return self._plan.ext_layout(layout)

    def publish(
        self,
        topic: str,
        body: bytes,
        delay: float | None,
        partition: int | None,
        sharding_key: ShardingKey | None,
        trace_id: int | None,
        headers: Mapping[str, Any] | None,
        tag: str | None,
        timeout: float | None,
    ) -> PublishResult | None:
        """Publish one message (see the front door's ``publish``)."""
        links = self._links
        if links.thread != get_ident() or links.forks != FORKS[0]:
            links.check_usable()
        plan = self._plan.publish(
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
        return self._plan.result(topic, plan, answer, address, part)

    def publish_many(
        self,
        topic: str,
        bodies: Iterable[bytes],
        partition: int | None,
        sharding_key: ShardingKey | None,
        trace_ids: Sequence[int] | None,
        tags: Sequence[str | None] | None,
        timeout: float | None,
        headers: ManyHeaders,
    ) -> list[PublishResult] | None:
        """Publish several messages (see the front door's ``publish_many``)."""
        links = self._links
        if links.thread != get_ident() or links.forks != FORKS[0]:
            links.check_usable()
        plan = self._plan.many(
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
        run = BatchRun(self._plan, topic, plan)
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
                self._failed += run.unacknowledged
                raise run.failed(exc)  # noqa: B904 - it sets the cause
            run.answered(request, *sent)
        return run.results()

    # -- internals -------------------------------------------------------------------------------

    def _send(self, data: bytes, timeout: float | None, count: int = 1) -> bytes:
        """Plain publish of ``count`` messages to the configured nsqd (no routing): the fast
        path."""
        if not self._links.open:
            raise self._links.not_open()
        limit = self._timeout if timeout is None else timeout
        spent = 0.0
        conn = self._ready_connection()
        if conn is not None:
            node = self._direct[0]
            start = conn.clock()
            try:
                answer = conn.request(data, publish=True, timeout=limit)
            except NSQTimeout:
                self._links.suspect(node, conn)
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

    def _check_retryable(
        self, exc: Exception, node: SyncLinkNode | None, conn: SyncConnection | None
    ) -> None:
        if isinstance(exc, OutcomeUnknown):
            # Sent, and the connection ended before the answer: nsqd may hold it already, so
            # sending it again could store it twice.
            if node is not None and conn is not None:
                self._links.discard(node, conn, False, exc)
            raise exc
        if isinstance(exc, ConfigRefused):  # the same settings fail the same way again
            raise exc
        if isinstance(exc, ServerError) and conn is not None:  # say, TLS that nsqd requires
            refused = config_refusal(exc, conn.address, handshake=False)
            if refused is not None:
                raise refused
        close = self._retry_action(exc)  # raises when it may not be retried
        if node is not None and conn is not None:
            self._links.discard(node, conn, close, exc)

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
        if not self._links.open:
            raise self._links.not_open()
        limit = self._timeout if timeout is None else timeout
        left = limit - spent
        # Fast path: the route is cached and its connection is up; no timer, no retry state.
        layout = self._lookup.cached(topic, "w") if self._lookup and topic else None
        route: tuple[str, int | None] | None = None
        if layout is not None and topic is not None and not deferred:
            conn = None
            node = None
            start = 0.0
            try:
                route = address, part = self._nodes.pick(topic, partition, key, layout)
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
                    self._links.suspect(node, conn)
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
            # Each step is bounded by the deadline; the links may add an outer bound (the
            # event loop's covers connecting and lookups).
            with self._links.bound(left):
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
            node: SyncLinkNode | None = None
            try:
                if self._lookup is not None and topic is not None:
                    if route is not None:  # already picked (and counted) by the fast path
                        (address, part), route = route, None
                    else:
                        layout = self._layout(topic, refresh, deadline)
                        if self._nodes.all_down(layout):
                            layout = self._elsewhere(topic, layout, deadline)
                        address, part = self._nodes.pick(topic, partition, key, layout)
                    node = self._nodes.node(address)
                    conn = self._links.connection(node, deadline)
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
                    self._links.suspect(node, conn)
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
            layout = self._links.refresh(topic, deadline)
        return layout

    def _elsewhere(self, topic: str, layout: TopicLayout, deadline: float) -> TopicLayout:
        """Every nsqd listed for classic ``topic`` is down: every nsqd lookupd knows, where
        nsqd creates the topic on its first PUB (consumers through lookupd find it there
        too). On the fork, or when lookupd cannot say, the topic's own nsqd."""
        try:
            return self._links.refresh(topic, deadline, everywhere=True)
        except (TopicNotFound, LookupFailed):
            return layout

    def _acquire(self, deadline: float) -> tuple[SyncLinkNode, SyncConnection]:
        """A connection to the next healthy configured nsqd, round-robin; opens one if needed."""
        last: Exception | None = None
        refused: ConfigRefused | None = None
        for node in self._nodes.direct_candidates():
            try:
                return node, self._links.connection(node, deadline)
            except ConnectionClosed as exc:
                last = exc
                if isinstance(exc, ConfigRefused):
                    refused = exc
        if refused is not None:  # the others cannot be reached: this is what to fix
            raise refused
        raise NoNsqdAvailable(f"no nsqd reachable; last error: {last}") from last

    def check_settings(self) -> None:
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
                with self._links.bound(limit):
                    self._links.connection(node, deadline)
            except ConfigRefused:
                raise
            except (NSQError, OSError, TimeoutError):
                continue  # reconnecting can fix it: the publishes try again
            return

    @staticmethod
    def _retry_action(exc: Exception) -> bool:
        """Whether a failed request may be retried; raises ``exc`` when it may not.

        Returns whether the connection it failed on should be closed first (a fatal error,
        or one that says the cluster changed).
        """
        if isinstance(exc, ServerError):
            if exc.retry is Retry.NEVER:
                raise exc
            return exc.fatal or exc.retry is Retry.AFTER_REFRESH
        return False

    def _next_attempt(self, exc: Exception, attempt: int) -> float:
        """Retry ``attempt`` (1, 2, ...) after ``exc``: the seconds to wait first; raises
        ``exc`` once ``max_retries`` are used up."""
        if attempt > self._max_retries:
            raise exc
        # DEBUG: every request in flight retries at once; the node's outage is logged once.
        log.debug("publish failed (%s); retry %d of %d", exc, attempt, self._max_retries)
        return float(self._retry_backoff * 2.0 ** (attempt - 1) * random.uniform(1, 1.5))
