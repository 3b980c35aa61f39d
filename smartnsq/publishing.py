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
from smartnsq.busy_poll import DEFAULT_LIMIT as BUSY_POLL_LIMIT
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
from smartnsq.observe.stats import ProducerNodeStats, ProducerStats
from smartnsq.ordered.sharding import Sharder, ShardingKey, key_bytes, sharder_for
from smartnsq.protocol import commands
from smartnsq.protocol.compress import (
    COMPRESS_KEY,
    DEFAULT_MIN_SIZE,
    SIZE_KEY,
    check_codec,
    compress_body,
)
from smartnsq.protocol.handshake import ConnectionConfig, Features, parse_address
from smartnsq.protocol.message import PublishResult, decode_publish_response
from smartnsq.protocol.names import validate_topic
from smartnsq.protocol.tags import TAG_KEY, check_tag
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


def mpub_count(topic: str, data: bytes) -> int:
    """How many messages an MPUB for ``topic`` carries (its header says)."""
    start = 10 + len(topic)  # "MPUB " + topic + "\n" + body size
    return int.from_bytes(data[start : start + 4])


def _spans(sizes: list[int], max_body_size: int) -> list[tuple[int, int]]:
    """Split messages of these encoded ``sizes`` into batches whose MPUB body (a 4-byte
    count, then the messages) fits ``max_body_size``; (start, end) of each."""
    spans = []
    start, size = 0, 4
    for i, n in enumerate(sizes):
        if i > start and size + n > max_body_size:
            spans.append((start, i))
            start, size = i, 4
        size += n
    spans.append((start, len(sizes)))
    return spans


def _ext_headers(
    headers: Mapping[str, Any] | None,
    tag: str | None,
    packed: tuple[bytes, dict[str, str]] | None,
) -> dict[str, Any]:
    """The ext header of one message: the caller's, its tag, its compression."""
    if headers is None:
        ext: dict[str, Any] = {}
    elif not isinstance(headers, Mapping):
        raise InvalidType("headers must be a mapping of JSON-serialisable values")
    else:
        ext = dict(headers)
        if COMPRESS_KEY in ext or SIZE_KEY in ext:
            # A consumed message's body is already decompressed: forwarding these with it
            # would make every consumer fail to decompress it.
            raise InvalidArgument(
                f"headers must not contain {COMPRESS_KEY!r} or {SIZE_KEY!r}: the producer "
                "sets them when it compresses (compress_topics=...); drop them"
            )
    if tag is not None:
        ext[TAG_KEY] = tag
    if packed is not None:
        ext.update(packed[1])
    return ext


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


N = TypeVar("N", bound=NodeHealth)


@dataclass(frozen=True, slots=True)
class Request:
    """One command of a publish call: built per partition once the route is known."""

    build: Build
    deferred: bool = False
    traced: bool = False  # the answer carries a PublishResult
    count: int = 1  # messages in it
    ext: bool = False  # PUB_EXT / MPUB_EXT: Youzan only


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
        compress_topics: Iterable[str] = (),
        compress_codec: Literal["snappy", "gzip", "lz4"] = "snappy",
        compress_min_size: int = DEFAULT_MIN_SIZE,
        busy_poll: float = BUSY_POLL_LIMIT,
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
        if isinstance(compress_topics, str | bytes) or not isinstance(compress_topics, Iterable):
            raise InvalidType("compress_topics must be a list of topic names")
        compress = frozenset(validate_topic(t) for t in compress_topics)
        self.compress_codec = check_codec(compress_codec, used=bool(compress))
        check_number("compress_min_size", compress_min_size, integer=True, min=0)
        self.compress_min_size = compress_min_size
        # Empty when off: the plain publish path then pays one truth test.
        self._compress_topics = compress
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
            busy_poll=busy_poll,
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
        self._failed = 0  # messages of calls that raised
        self._retried = 0  # requests sent again
        self._setup()

    def _setup(self) -> None:
        """The front door's own state (connections, lookups), after the settings."""

    def stats(self) -> ProducerStats:
        """Counters since the producer was created, in total and per nsqd.

        Returns:
            A :class:`~smartnsq.ProducerStats` snapshot.
        """
        nodes = {}
        for node in list(self._by_address.values()):
            connections, pending = node.load()
            nodes[node.address] = ProducerNodeStats(
                address=node.address,
                published=node.published,
                requests=node.requests,
                errors=node.errors,
                connections=connections,
                pending=pending,
                down=node.failures > 0,
            )
        every = nodes.values()
        return ProducerStats(
            published=sum(n.published for n in every),
            requests=sum(n.requests for n in every),
            failed=self._failed,
            retried=self._retried,
            connections=sum(n.connections for n in every),
            nodes=nodes,
        )

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
        tag: str | None = None,
    ) -> Request | bytes:
        """Check one publish; bytes to send as they are (no routing needed), or a request."""
        self._check_topic(topic)
        if timeout is not None:
            check_timeout("timeout", timeout)
        body = check_body(body)
        packed = None
        if self._compress_topics and delay is None:
            packed = self._compress(topic, body)
        size = len(body) if packed is None else len(packed[0])
        if size > self.max_message_size:
            raise MessageTooLarge(
                f"message of {size} bytes exceeds max_message_size "
                f"({self.max_message_size}); nsqd would reject it"
            )
        if (
            delay is None
            and partition is None
            and sharding_key is None
            and trace_id is None
            and headers is None
            and tag is None
            and packed is None
            and not self._lookupds
            and not (self.trace.active and self.trace.enabled(topic))
        ):
            return self._plain_pub(topic, body)
        self._check_routing(partition, sharding_key)
        if tag is not None:
            check_tag("tag", tag)
        if delay is not None:
            check_delay(delay, self.max_delay)
            if trace_id is not None or headers is not None or tag is not None:
                raise InvalidArgument("delay cannot be combined with trace_id, headers or tag")
            delay_ms = round(delay * 1000)
            return Request(lambda p: commands.dpub(topic, delay_ms, body), deferred=True)
        if trace_id is None and self.trace.enabled(topic):
            trace_id = new_trace_id()
        if trace_id is not None:
            check_trace_id(trace_id)
        if headers is not None or tag is not None or packed is not None:
            ext = _ext_headers(headers, tag, packed)
            if packed is not None:
                body = packed[0]
            if trace_id is not None:
                ext["##trace_id"] = str(trace_id)
            return Request(lambda p: commands.pub_ext(topic, body, ext, p), traced=True, ext=True)
        if trace_id is not None:
            tid = trace_id
            return Request(lambda p: commands.pub_trace(topic, body, tid, p), traced=True)
        return Request(lambda p: commands.pub(topic, body, p), traced=True)

    def _compress(self, topic: str, body: bytes) -> tuple[bytes, dict[str, str]] | None:
        """The compressed body and its headers, when the topic and the size call for it."""
        if len(body) < self.compress_min_size or topic not in self._compress_topics:
            return None
        return compress_body(self.compress_codec, body)

    def _plan_many(
        self,
        topic: str,
        bodies: Iterable[bytes],
        partition: int | None,
        sharding_key: ShardingKey | None,
        trace_ids: Sequence[int] | None,
        timeout: float | None,
        tags: Sequence[str | None] | None = None,
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
            and tags is None
            and partition is None
            and sharding_key is None
            and not self._lookupds
            and not (self._compress_topics and topic in self._compress_topics)
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
        if tags is not None or topic in self._compress_topics:
            ext = self._plan_many_ext(topic, checked, tags, trace_ids, partition, sharding_key)
            if ext is not None:
                return ext
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
        if 4 + overhead * len(lens) + total <= self.max_body_size:
            spans = [(0, len(lens))]
        else:
            spans = _spans([overhead + n for n in lens], self.max_body_size)
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

    def _plan_many_ext(
        self,
        topic: str,
        bodies: list[bytes],
        tags: Sequence[str | None] | None,
        trace_ids: Sequence[int] | None,
        partition: int | None,
        sharding_key: ShardingKey | None,
    ) -> Batches | None:
        """MPUB_EXT batches for tagged or compressed messages; None when neither applies."""
        if tags is not None:
            if isinstance(tags, str) or not isinstance(tags, Iterable):
                raise InvalidType("tags must be a list with one tag (or None) per message")
            tags = list(tags)
            if len(tags) != len(bodies):
                raise InvalidArgument(
                    f"got {len(bodies)} messages but {len(tags)} tags; give one per message "
                    "(None for an untagged one)"
                )
            for t in tags:
                if t is not None:
                    check_tag("tags", t)
        packs: list[tuple[bytes, dict[str, str]] | None] = [None] * len(bodies)
        if topic in self._compress_topics:
            packs = [self._compress(topic, b) for b in bodies]
        if tags is None and not any(packs):
            return None  # nothing to say in an ext header: plain MPUB
        if trace_ids is not None:
            raise InvalidArgument(
                "trace_ids cannot be combined with tags or compression (MPUB_EXT has no "
                "traced answer); publish those messages one by one with trace_id="
            )
        self._check_routing(partition, sharding_key)
        sent: list[bytes] = []
        headers: list[dict[str, Any] | None] = []
        lens: list[int] = []
        for i, body in enumerate(bodies):
            tag = None if tags is None else tags[i]
            packed = packs[i]
            if packed is not None:
                body = packed[0]
            header = None if tag is None and packed is None else _ext_headers(None, tag, packed)
            if len(body) > self.max_message_size:
                raise MessageTooLarge(
                    f"message of {len(body)} bytes exceeds max_message_size "
                    f"({self.max_message_size}); nothing was sent"
                )
            sent.append(body)
            headers.append(header)
            # [size][header length][header][body]; the header is small JSON, sized as sent
            lens.append(6 + len(commands.json_header(header) if header else b"") + len(body))
        requests = []
        for start, end in _spans(lens, self.max_body_size):
            build = partial(commands.mpub_ext, topic, sent[start:end], headers[start:end])
            requests.append(Request(build, count=end - start, ext=True))
        return Batches(requests, len(bodies), True, False)

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
        node.errors += 1
        node.mark_down(self._now(), f"cannot connect: {exc}")
        if isinstance(exc, ConnectionClosed | ServerError):
            return exc
        return ConnectFailed(f"nsqd {node.address}: {exc}")

    def _connected(self, node: N) -> None:
        """A new connection to ``node`` is open (not proof yet that it works)."""
        level = logging.DEBUG if node.failures else logging.INFO  # recovery logs at INFO
        log.log(level, "connected to nsqd %s", node.address)

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
        # DEBUG: every request in flight retries at once; the node's outage is logged once.
        log.debug("publish failed (%s); retry %d of %d", exc, attempt, self.max_retries)
        return float(self.retry_backoff * 2.0 ** (attempt - 1) * random.uniform(1, 1.5))


def batch_failed(exc: NSQError, done: int, total: int) -> NSQError:
    """What a publish_many raises when a batch fails after ``done`` messages were
    acknowledged: the error itself if none were, else :class:`PartialPublish`."""
    if done == 0:
        return exc
    err = PartialPublish(f"published {done} of {total} messages, then a batch failed: {exc}", done)
    err.__cause__ = exc
    return err
