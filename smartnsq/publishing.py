"""What the async and the blocking producers share, sans-IO.

:class:`ProducerCore` holds the settings (checked once and documented once, in its
``__init__``), the health of every nsqd and its connections (:class:`Node`), and the
policies: how a call becomes requests (planned by :class:`~smartnsq.publish_plan.PublishPlanner`),
where a request goes (:meth:`ProducerCore._pick`, nsqd that failed are avoided), which
connection takes it (:meth:`ProducerCore._reusable`), what an answer, a lost connection or
a timeout means for a node, and what an error means for a retry
(:meth:`ProducerCore._retry_action`). It does no I/O and reads no clock itself: sending,
waiting and retrying are :class:`~smartnsq.publish_io.AsyncPublisher`'s (and its generated
blocking twin's), over the front doors (:class:`smartnsq.Producer`,
:class:`smartnsq.sync.Producer`).
"""

from __future__ import annotations

import logging
import random
import ssl
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Generic, Literal, TypeVar

from smartnsq._checks import (
    DEFAULT_MAX_DELAY,
    DELAY_LIMIT,
    check_addresses,
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
    NoNsqdAvailable,
    NotSupported,
    NSQError,
    ProtocolError,
    Retry,
    ServerError,
)
from smartnsq.lookup.client import check_lookupd_addresses
from smartnsq.lookup.manager import LookupManager
from smartnsq.lookup.model import TopicLayout
from smartnsq.notice import settings_refused
from smartnsq.observe.stats import ProducerStats
from smartnsq.ordered.sharding import Sharder, ShardingKey, sharder_for
from smartnsq.protocol.compress import DEFAULT_MIN_SIZE, check_codec
from smartnsq.protocol.handshake import ConnectionConfig, config_refusal, parse_address
from smartnsq.protocol.message import PublishResult
from smartnsq.protocol.names import validate_topic
from smartnsq.publish_nodes import Conn, Node, NodeHealth, check_server, producer_stats, rank
from smartnsq.publish_plan import (
    Batches,
    Build,
    PublishPlanner,
    Request,
    batch_failed,
    emit_publish,
    mpub_count,
    not_sent_error,
    timeout_error,
)
from smartnsq.trace import TraceSwitch

__all__ = [
    "DEFAULT_MAX_BODY_SIZE",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "BatchRun",
    "Batches",
    "Build",
    "Node",
    "NodeHealth",
    "ProducerCore",
    "Request",
    "batch_failed",
    "check_server",
    "emit_publish",
    "mpub_count",
    "not_sent_error",
    "timeout_error",
]

log = logging.getLogger("smartnsq.producer")

DEFAULT_MAX_MESSAGE_SIZE = 1024 * 1024  # nsqd --max-msg-size default
DEFAULT_MAX_BODY_SIZE = 5 * 1024 * 1024  # nsqd --max-body-size default
# nsqd answers a publish at once; one unanswered this long (or a tenth of the timeout) means
# the node has most likely stopped answering.
_STALL_MAX = 0.5


N = TypeVar("N", bound=Node[Any, Any])


class ProducerCore(PublishPlanner, Generic[N]):
    """Settings, routing and node health of a producer; see the module docstring.

    Subclasses provide :meth:`_new_node` (their node, with their connection and lock
    types), :meth:`_now` (their clock) and :meth:`_setup` (their own state).
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
        """Both producers, [`smartnsq.Producer`][smartnsq.Producer] and
        [`smartnsq.sync.Producer`][smartnsq.sync.Producer], take these settings.

        Args:
            nsqd_tcp_addresses: nsqd TCP addresses (``host:port``) to publish to; publishes go
                to the healthy one with the fewest requests awaiting an answer, taking turns
                among equals. One whose oldest request has waited longer than a tenth of
                ``timeout`` (at most 0.5 s; nsqd answers at once) is stalled: passed over while
                another nsqd works, not marked down, used again once it answers. May be passed
                positionally.
            lookupd_http_addresses: nsqlookupd HTTP addresses (``host:port`` or an ``http(s)://``
                URL). With them, each topic's nsqd (on Youzan, its partitions and their leaders)
                come from the lookupds. A topic no lookupd knows yet goes, on a classic
                cluster, to one of the nsqd the lookupds know (nsqd creates a topic on its
                first PUB), with the usual failover; on the Youzan fork, where topics are
                created by an operator, it raises
                [`TopicNotFound`][smartnsq.errors.TopicNotFound] at once. At least one of
                ``nsqd_tcp_addresses`` and ``lookupd_http_addresses`` is required.
            lookupd_poll_interval: How long a topic's lookup answer is reused before the lookupds
                are asked again (with some jitter), in seconds, default 60.0. Cluster errors
                (a partition moved, its leader changed) refresh it at once.
            sharding: How a ``sharding_key`` maps to a Youzan partition: ``"go"`` (default;
                go-nsq's MurmurHash3 mapping), ``"java"`` (the Java SDK's ``hashCode`` mapping:
                a ``str`` key, or UTF-8 ``bytes``, matches ``setTopicShardingIDString``, an
                ``int`` key in Java's long range ``setTopicShardingIDLong``; other keys raise
                [`InvalidArgument`][smartnsq.errors.InvalidArgument]) or a callable
                ``(key, partition_count) -> partition``.
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
            connect_timeout: Seconds allowed for the TCP connection to an nsqd, and again for
                its handshake, default 5.0. A connection that does not complete them in time
                (an nsqd that accepts connections but does not answer) is a failed connect:
                nothing was sent, so the publish goes to another nsqd within its
                ``timeout``. Keep it below ``timeout`` for that to fit in one call.
            client_id: Client id reported to nsqd (shown in its stats); default: the short host
                name.
            identify: Extra fields for the IDENTIFY command (a dict of JSON values), sent as
                they are. Default None.
            max_delay: Longest ``delay`` ``publish`` accepts, in
                seconds, default 3600.0 (classic nsqd's default ``--max-req-timeout``); raise it
                when your nsqd allows more.
            auth_over_plaintext: ``False`` refuses to send ``auth_secret`` to an nsqd that asks
                for it over an unencrypted connection: the connection fails with
                [`InsecureAuth`][smartnsq.errors.InsecureAuth]. Default True.
            compress_topics: Youzan ext topics whose bodies the producer compresses itself, as
                go-nsq's ``TopicsForCompress`` does: a body of at least ``compress_min_size``
                bytes is sent compressed with PUB_EXT (MPUB_EXT) and the ext headers
                ``nsq.client.compress`` and ``nsq.msg.size``, which go-nsq and smartnsq
                consumers decompress. The topics must be ext topics. Default: none.
            compress_codec: ``"snappy"`` (default), ``"gzip"`` or ``"lz4"`` (needs
                ``pip install 'smartnsq[lz4]'``; a body that lz4 cannot shrink is sent as it is).
            compress_min_size: smallest body, in bytes, that is compressed (go-nsq's
                ``MessageSizeForCompress``, default 20480).
            busy_poll: Longest time, in seconds, a publish alone in flight on its connection
                keeps polling for nsqd's answer before the event loop (the blocking Producer:
                the thread) may sleep; default 0.0005, 0 turns it off. On a virtual machine an
                idle loop can take longer to wake than a local nsqd takes to answer, so this can
                cut a sequential publish's round trip by a third or more. It polls for about
                twice the answer times seen so far (giving the CPU away between polls), and
                not at all while they are longer than ``busy_poll`` (a remote or busy nsqd)
                or when the publish comes more than ``busy_poll`` after the last answer (a
                caller that paces itself). Concurrent publishes never poll; nor does a
                Producer on trio.

        Raises:
            InvalidArgument: A value is out of range, or neither ``nsqd_tcp_addresses`` nor
                ``lookupd_http_addresses`` was given.
            InvalidType: A value has the wrong type.


        Attributes:
            trace: Run-time trace switch ([`TraceSwitch`][smartnsq.trace.TraceSwitch]):
                while tracing is on for a topic, every publish to it is traced (a trace id is
                generated when none is given) and written as a ``publish`` trace record.
        """
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
            handshake_timeout=connect_timeout,
            identify_extra=identify or {},
            auth_over_plaintext=auth_over_plaintext,
            busy_poll=busy_poll,
        )
        # A producer has 29 instance attributes, front doors' included: measured on 3.11, a
        # 30th made every async publish ~10 % slower (past CPython's shared-key dict size,
        # attribute reads are no longer specialized). Add one only in place of another.
        self._by_address: dict[str, N] = {}
        self._direct = [self._node(a) for a in dict.fromkeys(nsqd_tcp_addresses)]
        self._lookupds = lookupds
        self._sharder = sharder_for(sharding)
        self._rr: dict[str, int] = {}
        self.trace = TraceSwitch()
        self._next = 0
        self._per_node = connections_per_nsqd
        self.timeout = timeout
        # A node whose oldest request waited this long is passed over while another works.
        self._stall_after = min(_STALL_MAX, timeout / 10)
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff
        self.max_message_size = max_message_size
        self.max_body_size = max_body_size
        self.max_delay = max_delay
        self._topics: set[str] = set()
        self._pub_lines: dict[str, bytes] = {}
        self._failed = 0  # messages of calls that raised
        self._retried = 0  # requests sent again
        self._closed = False  # close() was called
        self._lookup = (
            LookupManager(lookupds, cache_ttl=lookupd_poll_interval) if lookupds else None
        )
        self._setup()

    def _setup(self) -> None:
        """The front door's own state (connections, lookups), after the settings."""

    def stats(self) -> ProducerStats:
        """Counters since the producer was created, in total and per nsqd.

        Returns:
            A :class:`~smartnsq.ProducerStats` snapshot.
        """
        return producer_stats(list(self._by_address.values()), self._failed, self._retried)

    @staticmethod
    def _ext_layout(layout: TopicLayout) -> bool:
        """Whether a topic's write layout says it carries Youzan ext headers."""
        return bool(layout.meta is not None and layout.meta.extend_support)

    def _new_node(self, address: str) -> N:
        raise NotImplementedError

    def _now(self) -> float:
        raise NotImplementedError

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

    def _all_down(self, layout: TopicLayout) -> bool:
        """Every nsqd listed for a classic topic is avoided now (down, no probe due)."""
        if layout.partitioned or not layout.producers:
            return False
        now = self._now()
        nodes = self._by_address
        for listed in layout.producers:
            node = nodes.get(listed.tcp_address)
            if node is None or not node.failures or now >= node.down_until:
                return False
        return True

    def _take_turns(self, topic: str, addresses: list[str]) -> int:
        """The index of the next of ``addresses`` in turn; when that nsqd is busy or down,
        the best by :func:`rank` (the turn order breaks ties), claiming a recovering one
        (when all are down: the next one anyway)."""
        i = self._rr.get(topic, 0)
        self._rr[topic] = i + 1
        n = len(addresses)
        first = i % n
        nodes = self._by_address
        node = nodes.get(addresses[first])
        if node is None or (not node.failures and node.idle()):  # no clock, no sorting
            return first
        now = self._now()
        stall = self._stall_after
        order = [(i + k) % n for k in range(n)]
        order.sort(key=lambda j: rank(nodes.get(addresses[j]), now, stall))
        for j in order:
            node = nodes.get(addresses[j])
            if node is None or node.claim(now):
                return j
        return first

    def _direct_candidates(self) -> Iterator[N]:
        """The configured nsqd to try, in turn: those that work by :func:`rank` (the least
        busy first), then stalled ones, then those down, recovering soonest first; one that
        is down is passed over unless it is the last resort. Lazy: a recovering node is
        claimed only when its turn comes."""
        nodes = self._direct
        if not nodes:
            raise NoNsqdAvailable("no nsqd_tcp_addresses configured")
        now = self._now()
        n = len(nodes)
        start = self._next
        self._next = (start + 1) % n
        order = [nodes[(start + i) % n] for i in range(n)]
        stall = self._stall_after
        order.sort(key=lambda node: rank(node, now, stall))
        for node in order:
            if not node.failures or node.claim(now) or node is order[-1]:
                yield node

    @contextmanager
    def _opening(self, node: N) -> Iterator[None]:
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
            node.mark_down(self._now(), f"cannot connect: {exc}")
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

    def _timed_out(self, node: N) -> None:
        """A request to ``node`` timed out: avoid it for a while (the caller stops using the
        connection)."""
        node.errors += 1
        node.mark_down(self._now(), "did not answer a publish in time")

    def _forget(self, node: N, conn: Conn) -> None:
        """``conn`` ended: drop it; if it was lost (not closed by us), avoid its nsqd."""
        if node.drop(conn) and not self._closed and not conn.retiring:
            node.mark_down(self._now(), f"connection lost: {conn.close_reason}")

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


class BatchRun:
    """One ``publish_many`` while its batches go out in order: what was acknowledged, the
    results of traced batches, and what a failed batch raises."""

    __slots__ = ("_core", "_done", "_plan", "_results", "_topic")

    def __init__(self, core: ProducerCore[Any], topic: str, plan: Batches) -> None:
        self._core = core
        self._topic = topic
        self._plan = plan
        self._done = 0  # messages acknowledged
        self._results: list[PublishResult] = []

    def answered(self, request: Request, answer: bytes, address: str, part: int | None) -> None:
        result = self._core._result(self._topic, request, answer, address, part)
        if result is not None:
            self._results.append(result)
        self._done += request.count

    def failed(self, exc: NSQError) -> NSQError:
        """What to raise after ``exc``; the messages not acknowledged count as failed."""
        self._core._failed += self._plan.total - self._done
        return batch_failed(exc, self._done, self._plan.total)

    def results(self) -> list[PublishResult] | None:
        return self._results if self._plan.traced else None
