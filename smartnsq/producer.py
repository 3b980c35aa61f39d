"""The publishing front door: :class:`Producer`."""

from __future__ import annotations

import logging
import random
import ssl
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, Literal

import anyio
import anyio.abc

from smartnsq._checks import (
    DEFAULT_MAX_DELAY,
    DELAY_LIMIT,
    FORKS,
    check_addresses,
    check_delay,
    check_identify,
    check_number,
    check_timeout,
    get_ident,
    owner,
    wrong_owner,
)
from smartnsq.connection import Connection, ConnectionConfig, parse_address
from smartnsq.errors import (
    ConnectFailed,
    ConnectionClosed,
    InvalidArgument,
    InvalidType,
    MessageTooLarge,
    NoNsqdAvailable,
    NotSupported,
    NSQError,
    NSQTimeout,
    PartialPublish,
    ProtocolError,
    Retry,
    ServerError,
)
from smartnsq.lookup.client import check_lookupd_addresses
from smartnsq.lookup.manager import LookupManager
from smartnsq.lookup.model import TopicLayout
from smartnsq.ordered.sharding import Sharder, ShardingKey, key_bytes, sharder_for
from smartnsq.protocol import commands
from smartnsq.protocol.message import PublishResult, decode_publish_response
from smartnsq.protocol.names import validate_topic
from smartnsq.trace import TraceSwitch, emit

log = logging.getLogger("smartnsq.producer")

DEFAULT_MAX_MESSAGE_SIZE = 1024 * 1024  # nsqd --max-msg-size default
DEFAULT_MAX_BODY_SIZE = 5 * 1024 * 1024  # nsqd --max-body-size default
_MAX_DOWN = 30.0  # longest we avoid an nsqd that failed us
_PROBE_HOLD = 5.0  # while one request tries a recovering nsqd, the others go elsewhere
_pack_u32 = struct.Struct(">I").pack


def _check_body(body: object) -> bytes:
    """``body`` as bytes: any bytes-like object (bytearray, memoryview, ...) gives its bytes."""
    if type(body) is not bytes:
        if isinstance(body, str):
            raise InvalidType("message body must be bytes, not str: encode it first")
        try:
            body = memoryview(body).tobytes()  # type: ignore[arg-type]
        except TypeError:
            raise InvalidType(f"message body must be bytes, not {type(body).__name__}") from None
    if not body:
        raise InvalidArgument("message body must not be empty (nsqd rejects empty messages)")
    return body


def _sizes(lens: list[int]) -> tuple[int | None, int, int, int]:
    """(the size every body has, or None; shortest; longest; total) of non-empty ``lens``."""
    size = lens[0]
    if lens.count(size) == len(lens):  # same-size bodies (common in bulk): no more passes
        return size, size, size, size * len(lens)
    return None, min(lens), max(lens), sum(lens)


class _Node:
    """One nsqd: its connections and its health.

    A node that failed (could not be reached, answered garbage, let a request time out) is
    avoided for a growing while; then one request at a time may try it until one succeeds.
    """

    __slots__ = ("address", "connections", "down_until", "failures", "lock")

    def __init__(self, address: str) -> None:
        self.address = address
        self.connections: list[Connection] = []
        self.failures = 0
        self.down_until = 0.0
        self.lock = anyio.Lock()

    def mark_down(self) -> None:
        self.failures += 1
        delay = min(_MAX_DOWN, 0.1 * 2 ** min(self.failures, 10))
        self.down_until = anyio.current_time() + delay * random.uniform(0.5, 1.0)

    def mark_up(self) -> None:
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


class Producer:
    """Publishes messages to one or more nsqd.

    Use it as an async context manager::

        async with Producer(nsqd_tcp_addresses=["127.0.0.1:4150"]) as producer:
            await producer.publish("events", b"hello")

    Each call returns once nsqd has acknowledged the message, or raises. Requests are
    pipelined: many tasks may publish at once over the same connection. On a connection
    failure, or a server error that is safe to retry, the request is retried (on another nsqd
    when there is one) until ``max_retries`` or the call's ``timeout`` runs out. A retry after
    a connection broke mid-request can duplicate a message: NSQ delivers at least once.

    ``max_delay`` (seconds, default one hour as nsqd's ``--max-req-timeout``) is the longest
    ``delay`` :meth:`publish` accepts; raise it when your nsqd allows more.
    ``auth_over_plaintext=False`` refuses to send ``auth_secret`` to an nsqd without TLS.
    A Producer belongs to the event loop (thread) and process that entered it.
    """

    def __init__(
        self,
        nsqd_tcp_addresses: Sequence[str] = (),
        *,
        lookupd_http_addresses: Sequence[str] = (),
        lookupd_poll_interval: float = 60.0,
        sharding: Literal["go", "java"] | Sharder = "go",
        connections_per_nsqd: int = 1,
        timeout: float = 10.0,
        max_retries: int = 3,
        retry_backoff: float = 0.05,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_body_size: int = DEFAULT_MAX_BODY_SIZE,
        tls: ssl.SSLContext | bool = False,
        tls_hostname: str | None = None,
        snappy: bool = False,
        deflate: bool = False,
        deflate_level: int = 6,
        auth_secret: str | bytes | None = None,
        heartbeat_interval: float = 30.0,
        connect_timeout: float = 5.0,
        client_id: str | None = None,
        identify: dict[str, Any] | None = None,
        max_delay: float = DEFAULT_MAX_DELAY,
        auth_over_plaintext: bool = True,
    ) -> None:
        nsqd_tcp_addresses = check_addresses("nsqd_tcp_addresses", nsqd_tcp_addresses)
        lookupds = check_lookupd_addresses(
            check_addresses("lookupd_http_addresses", lookupd_http_addresses)
        )
        if not nsqd_tcp_addresses and not lookupds:
            raise InvalidArgument(
                "Producer needs nsqd_tcp_addresses or lookupd_http_addresses (or both)"
            )
        for address in nsqd_tcp_addresses:
            parse_address(address)
        check_number("connections_per_nsqd", connections_per_nsqd, integer=True, min=1)
        check_timeout("timeout", timeout)
        check_number("max_retries", max_retries, integer=True, min=0)
        check_number("retry_backoff", retry_backoff, min=0)
        check_number("max_message_size", max_message_size, integer=True)
        check_number("max_body_size", max_body_size, integer=True)
        check_timeout("lookupd_poll_interval", lookupd_poll_interval)
        check_number("max_delay", max_delay, min=0, max=DELAY_LIMIT)
        if identify is not None:
            check_identify("identify", identify)
        if max_message_size < 1 or max_body_size < max_message_size + 8:
            raise InvalidArgument("need 1 <= max_message_size and max_body_size >= it + 8")
        self._config = ConnectionConfig(
            client_id=client_id,
            tls=tls,
            tls_hostname=tls_hostname,
            snappy=snappy,
            deflate=deflate,
            deflate_level=deflate_level,
            auth_secret=auth_secret,
            heartbeat_interval=heartbeat_interval,
            connect_timeout=connect_timeout,
            identify_extra=identify or {},
            auth_over_plaintext=auth_over_plaintext,
        )
        self._by_address: dict[str, _Node] = {}
        self._direct = [self._node(a) for a in dict.fromkeys(nsqd_tcp_addresses)]
        if not lookupd_poll_interval > 0:
            raise InvalidArgument("lookupd_poll_interval must be > 0 seconds")
        self._lookup = (
            LookupManager(lookupds, cache_ttl=lookupd_poll_interval) if lookupds else None
        )
        self._sharder = sharder_for(sharding)
        self._rr: dict[str, int] = {}
        self.trace = TraceSwitch()
        self._next = 0
        self._per_node = connections_per_nsqd
        self.timeout = timeout
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff
        self.max_message_size = max_message_size
        self.max_body_size = max_body_size
        self.max_delay = max_delay
        self._thread: int | None = None  # owner thread and fork generation, set on entry
        self._forks = FORKS[0]
        self._topics: set[str] = set()
        self._pub_lines: dict[str, bytes] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._closed = False

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
        """
        if self._thread != get_ident() or self._forks != FORKS[0]:
            wrong_owner("Producer", self._thread, self._forks)
        if type(topic) is not str or topic not in self._topics:
            self._topics.add(validate_topic(topic))
        if timeout is not None:
            check_timeout("timeout", timeout)
        body = _check_body(body)
        if len(body) > self.max_message_size:
            raise MessageTooLarge(
                f"message of {len(body)} bytes exceeds max_message_size "
                f"({self.max_message_size}); nsqd would reject it"
            )
        plain = (
            delay is None
            and partition is None
            and sharding_key is None
            and trace_id is None
            and headers is None
            and self._lookup is None
            and not (self.trace.active and self.trace.enabled(topic))
        )
        if plain:
            line = self._pub_lines.get(topic)
            if line is None:
                line = self._pub_lines[topic] = b"PUB %s\n" % topic.encode()
            await self._send(b"".join((line, _pack_u32(len(body)), body)), timeout)
            return None
        self._check_routing(partition, sharding_key)
        if delay is not None:
            check_delay(delay, self.max_delay)
            if trace_id is not None or headers is not None:
                raise InvalidArgument("delay cannot be combined with trace_id or headers")
            delay_ms = round(delay * 1000)
            await self._send_routed(
                topic,
                lambda p: commands.dpub(topic, delay_ms, body),
                partition,
                sharding_key,
                timeout,
                deferred=True,
            )
            return None
        if trace_id is None and self.trace.enabled(topic):
            trace_id = _new_trace_id()
        if trace_id is not None:
            _check_trace_id(trace_id)
        if headers is not None:
            if not isinstance(headers, Mapping):
                raise InvalidType("headers must be a mapping of JSON-serialisable values")
            ext = dict(headers)
            if trace_id is not None:
                ext["##trace_id"] = str(trace_id)

            def build(p: int | None) -> bytes:
                return commands.pub_ext(topic, body, ext, p)
        elif trace_id is not None:
            tid = trace_id

            def build(p: int | None) -> bytes:
                return commands.pub_trace(topic, body, tid, p)
        else:

            def build(p: int | None) -> bytes:
                return commands.pub(topic, body, p)

        answer, address, part = await self._send_routed(
            topic, build, partition, sharding_key, timeout
        )
        result = decode_publish_response(answer)
        if result is not None and self.trace.enabled(topic):
            emit_publish(topic, part, address, result)
        return result

    async def publish_many(
        self,
        topic: str,
        bodies: Iterable[bytes],
        *,
        partition: int | None = None,
        sharding_key: ShardingKey | None = None,
        trace_ids: Sequence[int] | None = None,
        timeout: float | None = None,
    ) -> list[PublishResult] | None:
        """Publish several messages with MPUB, split into as few batches as nsqd accepts.

        Batches go out in order, all to one partition. If one fails after earlier ones
        succeeded, :class:`~smartnsq.errors.PartialPublish` says how many messages were
        acknowledged. With ``trace_ids`` (one per message; generated when tracing is on for the
        topic) it sends MPUB_TRACE and returns one :class:`PublishResult` per batch.
        """
        if self._thread != get_ident() or self._forks != FORKS[0]:
            wrong_owner("Producer", self._thread, self._forks)
        if type(topic) is not str or topic not in self._topics:
            self._topics.add(validate_topic(topic))
        if timeout is not None:
            check_timeout("timeout", timeout)
        if isinstance(bodies, bytes | bytearray | str):
            raise InvalidType("publish_many takes a list of message bodies, not a single body")
        if type(bodies) is not list and not isinstance(bodies, Iterable):
            raise InvalidType(
                f"publish_many takes a list of message bodies, not {type(bodies).__name__}"
            )
        checked = bodies if type(bodies) is list else list(bodies)
        if not checked:
            raise InvalidArgument("publish_many needs at least one message")
        if (
            trace_ids is None
            and partition is None
            and sharding_key is None
            and self._lookup is None
            and not self.trace.enabled(topic)
        ):
            data = self._mpub_fast(topic, checked)
            if data is not None:
                await self._send(data, timeout)
                return None
        if set(map(type, checked)) != {bytes}:
            checked = [_check_body(b) for b in checked]
        lens = list(map(len, checked))
        same, shortest, longest, total = _sizes(lens)
        if shortest == 0:
            raise InvalidArgument("message bodies must not be empty (nsqd rejects them)")
        limit = self.max_message_size
        if longest > limit:
            raise MessageTooLarge(
                f"message of {longest} bytes exceeds max_message_size ({limit}); nothing was sent"
            )
        if trace_ids is None and self.trace.enabled(topic):
            trace_ids = [_new_trace_id() for _ in checked]
        if trace_ids is not None:
            if not isinstance(trace_ids, Iterable):
                raise InvalidType(f"trace_ids must be a list of ints, not {trace_ids!r}")
            trace_ids = list(trace_ids)
            if len(trace_ids) != len(checked):
                raise InvalidArgument(
                    f"got {len(checked)} messages but {len(trace_ids)} trace ids; "
                    "give one per message"
                )
            for t in trace_ids:
                _check_trace_id(t)
        overhead = 12 if trace_ids is not None else 4
        batches: list[tuple[int, int]] = []
        if 4 + overhead * len(lens) + total <= self.max_body_size:
            batches.append((0, len(lens)))
        else:
            start, size = 0, 4
            for i, n in enumerate(lens):
                if i > start and size + overhead + n > self.max_body_size:
                    batches.append((start, i))
                    start, size = i, 4
                size += overhead + n
            batches.append((start, len(lens)))
        plain = trace_ids is None and partition is None and sharding_key is None
        if not plain:
            self._check_routing(partition, sharding_key)
        results: list[PublishResult] = []
        done = 0
        for start, end in batches:
            batch = checked[start:end]
            try:
                if plain and self._lookup is None:
                    await self._send(commands.mpub(topic, batch, None, same), timeout)
                elif trace_ids is None:
                    await self._send_routed(
                        topic,
                        partial(commands.mpub, topic, batch, size=same),
                        partition,
                        sharding_key,
                        timeout,
                    )
                else:
                    build = partial(commands.mpub_trace, topic, batch, trace_ids[start:end])
                    answer, address, part = await self._send_routed(
                        topic, build, partition, sharding_key, timeout
                    )
                    result = decode_publish_response(answer)
                    if result is not None:
                        results.append(result)
                        if self.trace.enabled(topic):
                            emit_publish(topic, part, address, result, count=len(batch))
            except NSQError as exc:
                if done == 0:
                    raise
                raise PartialPublish(
                    f"published {done} of {len(checked)} messages, then a batch failed: {exc}",
                    done,
                ) from exc
            done += len(batch)
        return results if trace_ids is not None else None

    def _mpub_fast(self, topic: str, bodies: list[Any]) -> bytes | None:
        """The MPUB for the usual call: one batch of non-empty bytes-like bodies that fit.

        The encoding does the type check (``bytes.join`` takes only bytes-like objects, as
        :func:`_check_body` does) and the length of the result shows any body whose ``len()``
        is not its size in bytes, so valid input costs no separate pass. ``None``: take the
        general path, which also words the error for bad input.
        """
        try:
            lens = list(map(len, bodies))
        except TypeError:
            return None
        same, shortest, longest, total = _sizes(lens)
        body_size = 4 + 4 * len(lens) + total
        if shortest == 0 or longest > self.max_message_size or body_size > self.max_body_size:
            return None
        try:
            data = commands.mpub(topic, bodies, None, same)
        except TypeError:  # not bytes-like
            return None
        # "MPUB " + topic + "\n" + body length + body; topic names are ASCII
        return data if len(data) == 10 + len(topic) + body_size else None

    def _check_routing(self, partition: int | None, key: ShardingKey | None) -> None:
        if partition is not None and key is not None:
            raise InvalidArgument("give either partition or sharding_key, not both")
        if partition is not None and (
            not isinstance(partition, int) or isinstance(partition, bool) or partition < 0
        ):
            raise InvalidArgument(f"partition must be an int >= 0, not {partition!r}")
        if key is not None:
            key_bytes(key)  # type check with a clear message
            if self._lookup is None:
                raise InvalidArgument(
                    "sharding_key needs the topic's partition count: configure "
                    "lookupd_http_addresses (or pass partition= yourself)"
                )

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
                raise self._timeout_error(limit) from None
            except (ConnectionClosed, ServerError) as exc:
                self._check_retryable(exc, conn)
            else:
                if node.failures:
                    node.mark_up()
                return answer
        answer, _, _ = await self._send_routed(None, lambda p: data, None, None, timeout)
        return answer

    @staticmethod
    def _timeout_error(limit: float) -> NSQTimeout:
        return NSQTimeout(
            f"publish not acknowledged within {limit}s; it may or may not have been published"
        )

    def _ready_connection(self) -> Connection | None:
        if len(self._direct) == 1:
            conns = self._direct[0].connections
            if conns and len(conns) >= self._per_node:
                best = min(conns, key=lambda c: c.pending) if len(conns) > 1 else conns[0]
                if best.usable:
                    return best
        return None

    def _check_retryable(self, exc: Exception, conn: Connection | None) -> None:
        if isinstance(exc, ServerError):
            if exc.retry is Retry.NEVER:
                raise exc
            if conn is not None and (exc.fatal or exc.retry is Retry.AFTER_REFRESH):
                self._tg.start_soon(conn.close, 0.0)  # type: ignore[union-attr]

    async def _send_routed(
        self,
        topic: str | None,
        build: Callable[[int | None], bytes],
        partition: int | None,
        key: ShardingKey | None,
        timeout: float | None,
        *,
        deferred: bool = False,
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
                ):
                    answer = await conn.request(build(part), publish=True, timeout=limit)
                    if node.failures:
                        node.mark_up()
                    return answer, address, part
            except NSQTimeout:
                if node is not None and conn is not None:
                    self._suspect(node, conn)
                raise self._timeout_error(limit) from None
            except (ConnectionClosed, ServerError, NoNsqdAvailable) as exc:
                self._check_retryable(exc, conn)
                route = None  # it failed: route afresh
        deadline = anyio.current_time() + limit
        try:
            # A request past the deadline raises NSQTimeout itself (and so names its
            # connection); this outer bound covers connecting and lookups.
            with anyio.fail_after(limit + 0.2):
                return await self._send_with_retries(
                    topic, build, partition, key, deferred, route, deadline
                )
        except (TimeoutError, NSQTimeout):
            raise self._timeout_error(limit) from None

    async def _send_with_retries(
        self,
        topic: str | None,
        build: Callable[[int | None], bytes],
        partition: int | None,
        key: ShardingKey | None,
        deferred: bool,
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
                if deferred and conn.features.youzan:
                    raise NotSupported(
                        f"nsqd {conn.address} is a Youzan HA server, which has no deferred "
                        "publish (DPUB); publish without delay"
                    )
                if part is not None and not conn.features.youzan:
                    raise NotSupported(
                        f"nsqd {conn.address} is a classic nsqd, which has no partitions; "
                        "publish without partition="
                    )
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
                if attempt > self.max_retries:
                    raise
                log.info("publish failed (%s); retry %d of %d", exc, attempt, self.max_retries)
                await anyio.sleep(self.retry_backoff * 2 ** (attempt - 1) * random.uniform(1, 1.5))

    async def _route(
        self, topic: str, partition: int | None, key: ShardingKey | None, refresh: bool
    ) -> tuple[str, int | None]:
        """Pick the nsqd (and partition) for one publish from the write lookup."""
        assert self._lookup is not None
        layout = None if refresh else self._lookup.cached(topic, "w")
        if layout is None:
            layout = await self._lookup.refresh(topic, "w")
        return self._pick(topic, partition, key, layout)

    def _pick(
        self, topic: str, partition: int | None, key: ShardingKey | None, layout: TopicLayout
    ) -> tuple[str, int | None]:
        if not layout.partitioned:
            nodes = layout.producers
            if not nodes:
                raise NoNsqdAvailable(f"lookupd lists no nsqd for topic {topic!r}")
            return self._take_turns(topic, [n.tcp_address for n in nodes]), partition
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
        address = self._take_turns(topic, addresses)
        return address, parts[addresses.index(address)]

    def _take_turns(self, topic: str, addresses: list[str]) -> str:
        """The next of ``addresses`` in turn, passing over nsqd that are down (unless all
        are: then the next one anyway)."""
        i = self._rr.get(topic, 0)
        self._rr[topic] = i + 1
        n = len(addresses)
        first = addresses[i % n]
        node = self._by_address.get(first)
        if node is None or not node.failures:
            return first
        now = anyio.current_time()
        for k in range(n):
            address = addresses[(i + k) % n]
            node = self._by_address.get(address)
            if node is None or node.claim(now):
                return address
        return first

    def _node(self, address: str) -> _Node:
        node = self._by_address.get(address)
        if node is None:
            node = self._by_address[address] = _Node(address)
        return node

    async def _acquire(self) -> tuple[_Node, Connection]:
        """A connection to the next healthy configured nsqd, round-robin; opens one if needed."""
        nodes = self._direct
        if not nodes:
            raise NoNsqdAvailable("no nsqd_tcp_addresses configured")
        now = anyio.current_time()
        n = len(nodes)
        start = self._next
        self._next = (start + 1) % n
        order = [nodes[(start + i) % n] for i in range(n)]
        # Healthy nodes first; nodes in back-off last, soonest-to-recover first.
        order.sort(key=lambda node: max(0.0, node.down_until - now))
        last: Exception | None = None
        for node in order:
            if node.failures and not node.claim(now) and node is not order[-1]:
                continue
            try:
                return node, await self._node_connection(node)
            except ConnectionClosed as exc:
                last = exc
        raise NoNsqdAvailable(f"no nsqd reachable; last error: {last}") from last

    async def _node_connection(self, node: _Node) -> Connection:
        conns = [c for c in node.connections if c.usable]
        if conns:
            best = min(conns, key=lambda c: c.pending)
            if best.pending == 0 or len(conns) >= self._per_node:
                return best
        async with node.lock:
            conns = [c for c in node.connections if c.usable]
            if len(conns) >= self._per_node:
                return min(conns, key=lambda c: c.pending)
            try:
                conn = await Connection.open(node.address, self._config)
            except (ConnectionClosed, ProtocolError, InvalidArgument) as exc:
                # unreachable, not speaking NSQ, or a bad address (port 0 from a lookupd)
                node.mark_down()
                if isinstance(exc, ConnectionClosed):
                    raise
                raise ConnectFailed(f"nsqd {node.address}: {exc}") from exc
            except ServerError:
                node.mark_down()
                raise
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
            node.mark_down()
            log.warning("connection to nsqd %s lost: %s", node.address, conn.close_reason)

    def _suspect(self, node: _Node, conn: Connection) -> None:
        """A request timed out: send nothing more through ``conn``, and avoid its nsqd."""
        node.mark_down()
        if not conn.retiring and self._tg is not None:
            log.warning(
                "nsqd %s did not answer a publish in time; avoiding it for now", node.address
            )
            self._tg.start_soon(conn.close, self.timeout)


def _pending(conn: Connection) -> int:
    return conn.pending


def _new_trace_id() -> int:
    return random.getrandbits(63) or 1


def _check_trace_id(trace_id: object) -> None:
    if not isinstance(trace_id, int) or isinstance(trace_id, bool) or not 0 <= trace_id < 2**64:
        raise InvalidArgument(f"trace_id must be an int in [0, 2**64), not {trace_id!r}")


def emit_publish(
    topic: str, partition: int | None, address: str, result: PublishResult, count: int = 1
) -> None:
    emit(
        "publish",
        topic=topic,
        partition=result.partition if partition is None else partition,
        nsqd=address,
        internal_id=result.internal_id,
        trace_id=result.trace_id,
        offset=result.offset,
        size=result.size,
        count=count,
    )
