"""What the async and the blocking producers share, sans-IO.

:class:`ProducerCore` holds the settings (checked once), the health of every nsqd, and the
policies: how a call becomes requests (:meth:`ProducerCore._plan_publish`,
:meth:`ProducerCore._plan_many`), where a request goes (:meth:`ProducerCore._pick`, nsqd
that failed are avoided), and what an error means for a retry
(:meth:`ProducerCore._retry_action`). It does no I/O and reads no clock itself: the front
doors (:class:`smartnsq.Producer`, :class:`smartnsq.sync.Producer`) send, wait and retry.
"""

from __future__ import annotations

import logging
import random
import ssl
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, Literal, TypeVar

from smartnsq._checks import (
    DEFAULT_MAX_DELAY,
    DELAY_LIMIT,
    check_addresses,
    check_delay,
    check_identify,
    check_number,
    check_timeout,
)
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
    Retry,
    ServerError,
)
from smartnsq.lookup.client import check_lookupd_addresses
from smartnsq.lookup.model import TopicLayout
from smartnsq.ordered.sharding import Sharder, ShardingKey, key_bytes, sharder_for
from smartnsq.protocol import commands
from smartnsq.protocol.handshake import ConnectionConfig, Features, parse_address
from smartnsq.protocol.message import PublishResult, decode_publish_response
from smartnsq.protocol.names import validate_topic
from smartnsq.trace import TraceSwitch, emit

log = logging.getLogger("smartnsq.producer")

DEFAULT_MAX_MESSAGE_SIZE = 1024 * 1024  # nsqd --max-msg-size default
DEFAULT_MAX_BODY_SIZE = 5 * 1024 * 1024  # nsqd --max-body-size default
_MAX_DOWN = 30.0  # longest we avoid an nsqd that failed us
_PROBE_HOLD = 5.0  # while one request tries a recovering nsqd, the others go elsewhere
_pack_u32 = struct.Struct(">I").pack

Build = Callable[[int | None], bytes]


def check_body(body: object) -> bytes:
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


def sizes(lens: list[int]) -> tuple[int | None, int, int, int]:
    """(the size every body has, or None; shortest; longest; total) of non-empty ``lens``."""
    size = lens[0]
    if lens.count(size) == len(lens):  # same-size bodies (common in bulk): no more passes
        return size, size, size, size * len(lens)
    return None, min(lens), max(lens), sum(lens)


def new_trace_id() -> int:
    return random.getrandbits(63) or 1


def check_trace_id(trace_id: object) -> None:
    if not isinstance(trace_id, int) or isinstance(trace_id, bool) or not 0 <= trace_id < 2**64:
        raise InvalidArgument(f"trace_id must be an int in [0, 2**64), not {trace_id!r}")


def timeout_error(limit: float) -> NSQTimeout:
    return NSQTimeout(
        f"publish not acknowledged within {limit}s; it may or may not have been published"
    )


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


def check_server(features: Features, address: str, part: int | None, deferred: bool) -> None:
    """Refuse, before sending, what this kind of nsqd cannot do."""
    if deferred and features.youzan:
        raise NotSupported(
            f"nsqd {address} is a Youzan HA server, which has no deferred "
            "publish (DPUB); publish without delay"
        )
    if part is not None and not features.youzan:
        raise NotSupported(
            f"nsqd {address} is a classic nsqd, which has no partitions; publish without partition="
        )


class NodeHealth:
    """One nsqd's health.

    A node that failed (could not be reached, answered garbage, let a request time out) is
    avoided for a growing while; then one request at a time may try it until one succeeds.
    """

    __slots__ = ("address", "down_until", "failures")

    def __init__(self, address: str) -> None:
        self.address = address
        self.failures = 0
        self.down_until = 0.0

    def mark_down(self, now: float) -> None:
        self.failures += 1
        delay = min(_MAX_DOWN, 0.1 * 2 ** min(self.failures, 10))
        self.down_until = now + delay * random.uniform(0.5, 1.0)

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


N = TypeVar("N", bound=NodeHealth)


@dataclass(frozen=True, slots=True)
class Request:
    """One command of a publish call: built per partition once the route is known."""

    build: Build
    deferred: bool = False
    traced: bool = False  # the answer carries a PublishResult
    count: int = 1  # messages in it


@dataclass(frozen=True, slots=True)
class Batches:
    """A publish_many call as requests, in order; ``routed`` when they need a route."""

    requests: list[Request]
    total: int
    routed: bool
    traced: bool  # MPUB_TRACE: one PublishResult per batch


class ProducerCore(Generic[N]):
    """Settings, routing and node health of a producer; see the module docstring.

    Subclasses provide :meth:`_new_node` (their node type, which adds connections),
    :meth:`_now` (their clock) and :meth:`_setup` (their own state).
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
        self._by_address: dict[str, N] = {}
        self._direct = [self._node(a) for a in dict.fromkeys(nsqd_tcp_addresses)]
        self._lookupds = lookupds
        self._poll_interval = lookupd_poll_interval
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
        self._topics: set[str] = set()
        self._pub_lines: dict[str, bytes] = {}
        self._setup()

    def _setup(self) -> None:
        """The front door's own state (connections, lookups), after the settings."""

    def _new_node(self, address: str) -> N:
        raise NotImplementedError

    def _now(self) -> float:
        raise NotImplementedError

    # -- planning --------------------------------------------------------------------------------

    def _check_topic(self, topic: str) -> None:
        if type(topic) is not str or topic not in self._topics:
            self._topics.add(validate_topic(topic))

    def _plain_pub(self, topic: str, body: bytes) -> bytes:
        """The PUB command, with the topic's command line built once."""
        line = self._pub_lines.get(topic)
        if line is None:
            line = self._pub_lines[topic] = b"PUB %s\n" % topic.encode()
        return b"".join((line, _pack_u32(len(body)), body))

    def _plan_publish(
        self,
        topic: str,
        body: bytes,
        delay: float | None,
        partition: int | None,
        sharding_key: ShardingKey | None,
        trace_id: int | None,
        headers: Mapping[str, Any] | None,
        timeout: float | None,
    ) -> Request | bytes:
        """Check one publish; bytes to send as they are (no routing needed), or a request."""
        self._check_topic(topic)
        if timeout is not None:
            check_timeout("timeout", timeout)
        body = check_body(body)
        if len(body) > self.max_message_size:
            raise MessageTooLarge(
                f"message of {len(body)} bytes exceeds max_message_size "
                f"({self.max_message_size}); nsqd would reject it"
            )
        if (
            delay is None
            and partition is None
            and sharding_key is None
            and trace_id is None
            and headers is None
            and not self._lookupds
            and not (self.trace.active and self.trace.enabled(topic))
        ):
            return self._plain_pub(topic, body)
        self._check_routing(partition, sharding_key)
        if delay is not None:
            check_delay(delay, self.max_delay)
            if trace_id is not None or headers is not None:
                raise InvalidArgument("delay cannot be combined with trace_id or headers")
            delay_ms = round(delay * 1000)
            return Request(lambda p: commands.dpub(topic, delay_ms, body), deferred=True)
        if trace_id is None and self.trace.enabled(topic):
            trace_id = new_trace_id()
        if trace_id is not None:
            check_trace_id(trace_id)
        if headers is not None:
            if not isinstance(headers, Mapping):
                raise InvalidType("headers must be a mapping of JSON-serialisable values")
            ext = dict(headers)
            if trace_id is not None:
                ext["##trace_id"] = str(trace_id)
            return Request(lambda p: commands.pub_ext(topic, body, ext, p), traced=True)
        if trace_id is not None:
            tid = trace_id
            return Request(lambda p: commands.pub_trace(topic, body, tid, p), traced=True)
        return Request(lambda p: commands.pub(topic, body, p), traced=True)

    def _plan_many(
        self,
        topic: str,
        bodies: Iterable[bytes],
        partition: int | None,
        sharding_key: ShardingKey | None,
        trace_ids: Sequence[int] | None,
        timeout: float | None,
    ) -> Batches | bytes:
        """Check a publish_many; one MPUB to send as it is, or the batches."""
        self._check_topic(topic)
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
            and not self._lookupds
            and not self.trace.enabled(topic)
        ):
            data = self._mpub_fast(topic, checked)
            if data is not None:
                return data
        if set(map(type, checked)) != {bytes}:
            checked = [check_body(b) for b in checked]
        lens = list(map(len, checked))
        same, shortest, longest, total = sizes(lens)
        if shortest == 0:
            raise InvalidArgument("message bodies must not be empty (nsqd rejects them)")
        limit = self.max_message_size
        if longest > limit:
            raise MessageTooLarge(
                f"message of {longest} bytes exceeds max_message_size ({limit}); nothing was sent"
            )
        if trace_ids is None and self.trace.enabled(topic):
            trace_ids = [new_trace_id() for _ in checked]
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
                check_trace_id(t)
        overhead = 12 if trace_ids is not None else 4
        spans: list[tuple[int, int]] = []
        if 4 + overhead * len(lens) + total <= self.max_body_size:
            spans.append((0, len(lens)))
        else:
            start, size = 0, 4
            for i, n in enumerate(lens):
                if i > start and size + overhead + n > self.max_body_size:
                    spans.append((start, i))
                    start, size = i, 4
                size += overhead + n
            spans.append((start, len(lens)))
        routed = trace_ids is not None or partition is not None or sharding_key is not None
        if routed:
            self._check_routing(partition, sharding_key)
        routed = routed or bool(self._lookupds)
        requests = []
        for start, end in spans:
            batch = checked[start:end]
            if trace_ids is None:
                requests.append(
                    Request(partial(commands.mpub, topic, batch, size=same), count=len(batch))
                )
            else:
                build = partial(commands.mpub_trace, topic, batch, trace_ids[start:end])
                requests.append(Request(build, traced=True, count=len(batch)))
        return Batches(requests, len(checked), routed, trace_ids is not None)

    def _mpub_fast(self, topic: str, bodies: list[Any]) -> bytes | None:
        """The MPUB for the usual call: one batch of non-empty bytes-like bodies that fit.

        The encoding does the type check (``bytes.join`` takes only bytes-like objects, as
        :func:`check_body` does) and the length of the result shows any body whose ``len()``
        is not its size in bytes, so valid input costs no separate pass. ``None``: take the
        general path, which also words the error for bad input.
        """
        try:
            lens = list(map(len, bodies))
        except TypeError:
            return None
        same, shortest, longest, total = sizes(lens)
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
            if not self._lookupds:
                raise InvalidArgument(
                    "sharding_key needs the topic's partition count: configure "
                    "lookupd_http_addresses (or pass partition= yourself)"
                )

    def _result(
        self, topic: str, request: Request, answer: bytes, address: str, part: int | None
    ) -> PublishResult | None:
        """The PublishResult of a traced answer (logged when tracing is on for the topic)."""
        if not request.traced:
            return None
        result = decode_publish_response(answer)
        if result is not None and self.trace.enabled(topic):
            emit_publish(topic, part, address, result, count=request.count)
        return result

    # -- routing ---------------------------------------------------------------------------------

    def _node(self, address: str) -> N:
        node = self._by_address.get(address)
        if node is None:
            node = self._by_address[address] = self._new_node(address)
        return node

    def _pick(
        self, topic: str, partition: int | None, key: ShardingKey | None, layout: TopicLayout
    ) -> tuple[str, int | None]:
        """The nsqd (and partition) for one publish, from the topic's write layout."""
        if not layout.partitioned:
            nodes = layout.producers
            if not nodes:
                raise NoNsqdAvailable(f"lookupd lists no nsqd for topic {topic!r}")
            addresses = [n.tcp_address for n in nodes]
            return addresses[self._take_turns(topic, addresses)], partition
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
        i = self._take_turns(topic, addresses)
        return addresses[i], parts[i]

    def _take_turns(self, topic: str, addresses: list[str]) -> int:
        """The index of the next of ``addresses`` in turn, passing over nsqd that are down
        (unless all are: then the next one anyway)."""
        i = self._rr.get(topic, 0)
        self._rr[topic] = i + 1
        n = len(addresses)
        first = i % n
        node = self._by_address.get(addresses[first])
        if node is None or not node.failures:
            return first
        now = self._now()
        for k in range(n):
            j = (i + k) % n
            node = self._by_address.get(addresses[j])
            if node is None or node.claim(now):
                return j
        return first

    def _direct_candidates(self) -> Iterator[N]:
        """The configured nsqd to try, in turn: healthy ones first, then those recovering
        soonest; one that is down is passed over unless it is the last resort. Lazy: a
        recovering node is claimed only when its turn comes."""
        nodes = self._direct
        if not nodes:
            raise NoNsqdAvailable("no nsqd_tcp_addresses configured")
        now = self._now()
        n = len(nodes)
        start = self._next
        self._next = (start + 1) % n
        order = [nodes[(start + i) % n] for i in range(n)]
        order.sort(key=lambda node: max(0.0, node.down_until - now))
        for node in order:
            if not node.failures or node.claim(now) or node is order[-1]:
                yield node

    def _open_failed(self, node: N, exc: Exception) -> Exception:
        """Opening a connection to ``node`` raised ``exc``: mark it down; what to raise.

        Unreachable, not speaking NSQ, or a bad address (port 0 from a lookupd) are all
        connection failures, which the caller retries elsewhere; a server error stays one.
        """
        node.mark_down(self._now())
        if isinstance(exc, ConnectionClosed | ServerError):
            return exc
        return ConnectFailed(f"nsqd {node.address}: {exc}")

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
        if attempt > self.max_retries:
            raise exc
        log.info("publish failed (%s); retry %d of %d", exc, attempt, self.max_retries)
        return float(self.retry_backoff * 2.0 ** (attempt - 1) * random.uniform(1, 1.5))


def batch_failed(exc: NSQError, done: int, total: int) -> NSQError:
    """What a publish_many raises when a batch fails after ``done`` messages were
    acknowledged: the error itself if none were, else :class:`PartialPublish`."""
    if done == 0:
        return exc
    err = PartialPublish(f"published {done} of {total} messages, then a batch failed: {exc}", done)
    err.__cause__ = exc
    return err
