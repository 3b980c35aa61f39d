"""The publishing front door: :class:`Producer`."""

from __future__ import annotations

import logging
import math
import random
import ssl
import struct
import time
from collections.abc import Iterable, Sequence
from typing import Any

import anyio
import anyio.abc

from smartnsq.connection import Connection, ConnectionConfig, parse_address
from smartnsq.errors import (
    ConnectionClosed,
    InvalidArgument,
    InvalidType,
    MessageTooLarge,
    NoNsqdAvailable,
    NotSupported,
    NSQError,
    NSQTimeout,
    PartialPublish,
    Retry,
    ServerError,
)
from smartnsq.protocol import commands
from smartnsq.protocol.names import validate_topic

log = logging.getLogger("smartnsq.producer")

DEFAULT_MAX_MESSAGE_SIZE = 1024 * 1024  # nsqd --max-msg-size default
DEFAULT_MAX_BODY_SIZE = 5 * 1024 * 1024  # nsqd --max-body-size default
_MAX_DOWN = 30.0  # longest we avoid an nsqd that refused us
_pack_u32 = struct.Struct(">I").pack


def _check_body(body: object) -> bytes:
    if type(body) is not bytes:
        if isinstance(body, bytearray | memoryview):
            body = bytes(body)
        elif isinstance(body, str):
            raise InvalidType("message body must be bytes, not str: encode it first")
        else:
            raise InvalidType(f"message body must be bytes, not {type(body).__name__}")
    if not body:
        raise InvalidArgument("message body must not be empty (nsqd rejects empty messages)")
    return body


class _Node:
    """One configured nsqd: its connections and its health."""

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
    """

    def __init__(
        self,
        nsqd_tcp_addresses: Sequence[str] = (),
        *,
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
    ) -> None:
        if isinstance(nsqd_tcp_addresses, str):
            nsqd_tcp_addresses = [nsqd_tcp_addresses]
        if not nsqd_tcp_addresses:
            raise InvalidArgument("Producer needs at least one address in nsqd_tcp_addresses")
        for address in nsqd_tcp_addresses:
            parse_address(address)
        if connections_per_nsqd < 1:
            raise InvalidArgument("connections_per_nsqd must be >= 1")
        if not timeout > 0:
            raise InvalidArgument("timeout must be > 0 seconds")
        if max_retries < 0:
            raise InvalidArgument("max_retries must be >= 0")
        if max_message_size < 1 or max_body_size < max_message_size + 8:
            raise InvalidArgument("need 1 <= max_message_size and max_body_size >= it + 8")
        extra: dict[str, Any] = {}
        if client_id is not None:
            extra["client_id"] = client_id
        self._config = ConnectionConfig(
            tls=tls,
            tls_hostname=tls_hostname,
            snappy=snappy,
            deflate=deflate,
            deflate_level=deflate_level,
            auth_secret=auth_secret,
            heartbeat_interval=heartbeat_interval,
            connect_timeout=connect_timeout,
            identify_extra=identify or {},
            **extra,
        )
        self._nodes = [_Node(a) for a in dict.fromkeys(nsqd_tcp_addresses)]
        self._next = 0
        self._per_node = connections_per_nsqd
        self.timeout = timeout
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff
        self.max_message_size = max_message_size
        self.max_body_size = max_body_size
        self._topics: set[str] = set()
        self._pub_lines: dict[str, bytes] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> Producer:
        if self._tg is not None or self._closed:
            raise NSQError("a Producer can be entered only once")
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
            for node in self._nodes:
                for conn in list(node.connections):
                    await conn.close()
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
        timeout: float | None = None,
    ) -> None:
        """Publish one message; with ``delay`` (seconds) nsqd holds it back that long (DPUB)."""
        if topic not in self._topics:
            self._topics.add(validate_topic(topic))
        body = _check_body(body)
        if len(body) > self.max_message_size:
            raise MessageTooLarge(
                f"message of {len(body)} bytes exceeds max_message_size "
                f"({self.max_message_size}); nsqd would reject it"
            )
        if delay is None:
            line = self._pub_lines.get(topic)
            if line is None:
                line = self._pub_lines[topic] = b"PUB %s\n" % topic.encode()
            await self._send(b"".join((line, _pack_u32(len(body)), body)), timeout)
            return
        if not isinstance(delay, int | float) or not math.isfinite(delay) or delay < 0:
            raise InvalidArgument(f"delay must be a finite number of seconds >= 0, not {delay!r}")
        await self._send(commands.dpub(topic, round(delay * 1000), body), timeout, deferred=True)

    async def publish_many(
        self, topic: str, bodies: Iterable[bytes], *, timeout: float | None = None
    ) -> None:
        """Publish several messages with MPUB, split into as few batches as nsqd accepts.

        Batches go out in order. If one fails after earlier ones succeeded,
        :class:`~smartnsq.errors.PartialPublish` says how many messages were acknowledged.
        """
        if topic not in self._topics:
            self._topics.add(validate_topic(topic))
        if isinstance(bodies, bytes | bytearray | str):
            raise InvalidType("publish_many takes a list of message bodies, not a single body")
        checked = bodies if type(bodies) is list else list(bodies)
        if not checked:
            raise InvalidArgument("publish_many needs at least one message")
        # Fast path (C-level checks) for the common case: non-empty bytes that fit.
        if set(map(type, checked)) != {bytes}:
            checked = [_check_body(b) for b in checked]
        lens = list(map(len, checked))
        if min(lens) == 0:
            raise InvalidArgument("message bodies must not be empty (nsqd rejects them)")
        limit = self.max_message_size
        if max(lens) > limit:
            raise MessageTooLarge(
                f"message of {max(lens)} bytes exceeds max_message_size ({limit}); nothing was sent"
            )
        batches: list[tuple[list[bytes], list[int]]] = []
        if 4 + 4 * len(lens) + sum(lens) <= self.max_body_size:
            batches.append((checked, lens))
        else:
            start, size = 0, 4
            for i, n in enumerate(lens):
                if i > start and size + 4 + n > self.max_body_size:
                    batches.append((checked[start:i], lens[start:i]))
                    start, size = i, 4
                size += 4 + n
            batches.append((checked[start:], lens[start:]))
        line = b"MPUB %s\n" % topic.encode()
        done = 0
        for batch, sizes in batches:
            parts: list[bytes] = [b""] * (2 * len(batch))
            parts[0::2] = map(_pack_u32, sizes)
            parts[1::2] = batch
            body = b"".join(parts)
            data = b"".join((line, _pack_u32(len(body) + 4), _pack_u32(len(batch)), body))
            try:
                await self._send(data, timeout)
            except NSQError as exc:
                if done == 0:
                    raise
                raise PartialPublish(
                    f"published {done} of {len(checked)} messages, then a batch failed: {exc}",
                    done,
                ) from exc
            done += len(batch)

    # -- internals -------------------------------------------------------------------------------

    async def _send(self, data: bytes, timeout: float | None, deferred: bool = False) -> bytes:
        if self._tg is None or self._closed:
            raise NSQError("use the Producer inside 'async with Producer(...)' (or it is closed)")
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        # Fast path: an established connection, no retry bookkeeping.
        conn = self._ready_connection()
        if conn is not None and not deferred:
            try:
                return await conn.request(data, publish=True, timeout=limit)
            except NSQTimeout:
                raise self._timeout_error(limit) from None
            except (ConnectionClosed, ServerError) as exc:
                self._check_retryable(exc, conn)
        try:
            with anyio.fail_after(max(0.0, deadline - time.monotonic())):
                return await self._send_with_retries(data, deferred)
        except TimeoutError:
            raise self._timeout_error(limit) from None

    @staticmethod
    def _timeout_error(limit: float) -> NSQTimeout:
        return NSQTimeout(
            f"publish not acknowledged within {limit}s; it may or may not have been published"
        )

    def _ready_connection(self) -> Connection | None:
        if len(self._nodes) == 1:
            conns = self._nodes[0].connections
            if conns and len(conns) >= self._per_node:
                best = min(conns, key=lambda c: c.pending) if len(conns) > 1 else conns[0]
                if best.usable:
                    return best
        return None

    def _check_retryable(self, exc: Exception, conn: Connection) -> None:
        if isinstance(exc, ServerError):
            if exc.retry is Retry.NEVER:
                raise exc
            if exc.fatal or exc.retry is Retry.AFTER_REFRESH:
                self._tg.start_soon(conn.close, 0.0)  # type: ignore[union-attr]

    async def _send_with_retries(self, data: bytes, deferred: bool) -> bytes:
        attempt = 0
        while True:
            conn: Connection | None = None
            try:
                conn = await self._acquire()
                if deferred and conn.features.youzan:
                    raise NotSupported(
                        f"nsqd {conn.address} is a Youzan HA server, which has no deferred "
                        "publish (DPUB); publish without delay"
                    )
                return await conn.request(data, publish=True)
            except (ConnectionClosed, NoNsqdAvailable, ServerError) as exc:
                if conn is not None:
                    self._check_retryable(exc, conn)
                attempt += 1
                if attempt > self.max_retries:
                    raise
                log.info("publish failed (%s); retry %d of %d", exc, attempt, self.max_retries)
                await anyio.sleep(self.retry_backoff * 2 ** (attempt - 1) * random.uniform(1, 1.5))

    async def _acquire(self) -> Connection:
        """A connection to the next healthy nsqd, round-robin; opens one if needed."""
        now = anyio.current_time()
        n = len(self._nodes)
        start = self._next
        self._next = (start + 1) % n
        order = [self._nodes[(start + i) % n] for i in range(n)]
        # Healthy nodes first; nodes in back-off last, soonest-to-recover first.
        order.sort(key=lambda node: max(0.0, node.down_until - now))
        last: Exception | None = None
        for node in order:
            try:
                return await self._node_connection(node)
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
            except ConnectionClosed:
                node.mark_down()
                raise
            node.mark_up()
            conn.on_close = lambda c: self._forget(node, c)
            node.connections.append(conn)
            assert self._tg is not None
            self._tg.start_soon(conn.run)
            return conn

    def _forget(self, node: _Node, conn: Connection) -> None:
        if conn in node.connections:
            node.connections.remove(conn)
        if not self._closed and isinstance(conn.close_reason, ConnectionClosed):
            log.warning("connection to nsqd %s lost: %s", node.address, conn.close_reason)
