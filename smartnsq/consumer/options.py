"""A consumer's options: declared once, checked once.

:class:`Options` is the one definition of every argument of :class:`smartnsq.Consumer`: its
name, type, default and description. The Consumers' signatures and ``Args:`` sections
(``smartnsq.Consumer`` and ``smartnsq.sync.Consumer``) are written from it by
``scripts/consumer_options.py`` (edit a field here, then run it; ``--check`` fails on a stale
copy). The async Consumer builds :class:`Options` from its arguments, which checks them; the
blocking Consumer hands its arguments to the async Consumer it runs.
"""

from __future__ import annotations

import inspect
import ssl
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from smartnsq._checks import (
    DELAY_LIMIT,
    check_addresses,
    check_bool,
    check_callable,
    check_number,
)
from smartnsq.consumer.message import Message
from smartnsq.errors import InvalidArgument, InvalidType
from smartnsq.lookup.client import check_lookupd_addresses
from smartnsq.net.connection import ConnectionConfig, parse_address
from smartnsq.offsets import StartPlan
from smartnsq.protocol.names import validate_channel, validate_topic
from smartnsq.protocol.offsets import Start
from smartnsq.protocol.tags import check_tag

#: What a handler may return: None (or anything but False) FINs the message, False REQs it.
#: An awaitable (what an ``async def`` handler, or a plain function forwarding to one,
#: returns) is awaited first and its result counts.
Handler = Callable[[Message], Awaitable[bool | None] | bool | None]


def is_async_handler(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is an ``async def`` function, or an object whose ``__call__`` is."""
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


#: ``on_giving_up``: called with the message, and the reason when it takes two arguments.
GivingUp = Callable[[Message], Any] | Callable[[Message, Exception | None], Any]


def takes_reason(fn: Callable[..., Any]) -> bool:
    """Whether an ``on_giving_up`` callback takes a second argument, the reason."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read (some builtins): one argument
        return False
    positional = 0
    for p in params:
        if p.kind is p.VAR_POSITIONAL:
            return True
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            positional += 1
    return positional >= 2


@dataclass
class Options:
    """Every argument of :class:`smartnsq.Consumer`, checked on creation; derived values
    (``direct``, ``lookupds``, ``workers``, ``config``, ``start_plan``, ...) follow them.

    Each field is an argument of the Consumers, in their order (``_: KW_ONLY`` is their
    ``*``), and the string under it is its description in their docstrings.
    """

    topic: str
    """The topic to consume (NSQ's naming rules: 1-64 characters of ``[.a-zA-Z0-9_-]``,
    optionally ending in ``#ephemeral``)."""
    channel: str
    """The channel to subscribe to (the same rules as ``topic``). Consumers on one channel share
    its messages; each channel gets every message."""
    handler: Handler | None = None
    """Called with each [`Message`][smartnsq.Message]. An ``async def`` handler runs on the
    event loop, ``concurrency`` at a time; a plain ``def`` handler runs in a pool of up to
    ``concurrency`` worker threads. Returning ``None``, ``True`` or anything but ``False`` FINs
    the message; returning ``False`` or raising REQs it (the exception is logged with its
    traceback) and counts as a failure for backoff. An awaitable it returns is awaited first.
    ``None`` (the default): no handler; iterate with ``async for message in consumer``."""
    _: KW_ONLY
    nsqd_tcp_addresses: Sequence[str] = ()
    """nsqd TCP addresses (``host:port``) to connect to directly. Each is kept connected
    (reconnecting with backoff, see ``reconnect_min``) whatever the lookupds say."""
    lookupd_http_addresses: Sequence[str] = ()
    """nsqlookupd HTTP addresses (``host:port`` or an ``http(s)://`` URL), all asked at once;
    the consumer follows the nsqd they list ([discovery][consumer-discovery]). At least one of
    ``nsqd_tcp_addresses`` and ``lookupd_http_addresses`` is required."""
    max_in_flight: int = 1
    """Most messages held at once over all connections (the sum of the RDY counts,
    [spread][consumer-rdy-backoff] over them), an int >= 0; 0 pauses. Default 1. Change it with
    [`set_max_in_flight`][smartnsq.Consumer.set_max_in_flight]."""
    max_attempts: int = 5
    """A message delivered more than this many times is not handed to the handler: it goes to
    ``on_giving_up`` (or a warning is logged) and is FINed. 0 means no limit (not with a
    ``dead_letter_topic``). Not applied on ordered partitions, where skipping a message would
    break the order, unless there is a ``dead_letter_topic``. Default 5."""
    requeue_delay: float = 90.0
    """Delay of a REQ when the handler fails (or calls ``message.requeue()`` without a delay):
    ``requeue_delay`` times the message's attempts, capped by ``max_requeue_delay``. Default
    90.0. Ordered partitions always requeue with no delay."""
    max_requeue_delay: float = 3600.0
    """Cap of that delay, default 3600.0 (nsqd caps it at its own ``--max-req-timeout`` too)."""
    backoff: bool = True
    """Whether failures slow consumption down: RDY 0 for a window that doubles with each
    failure, then RDY 1 to test the waters ([backoff][consumer-rdy-backoff]). Default True."""
    max_backoff_duration: float = 128.0
    """Longest backoff window, default 128.0 (> 0)."""
    backoff_unit: float = 1.0
    """Length of the level-1 backoff window's unit, default 1.0 (> 0)."""
    lookupd_poll_interval: float = 60.0
    """Time between two lookupd queries, default 60.0 (> 0)."""
    lookupd_poll_jitter: float = 0.3
    """Random variation of that time, in ``[0, 1)``; default 0.3."""
    reconnect_min: float = 0.5
    """Base of the delay before reconnecting to an nsqd, doubled with each failure in a row,
    default 0.5 (> 0)."""
    reconnect_max: float = 60.0
    """Longest delay between reconnection attempts, default 60.0 (> 0)."""
    rdy_redistribute_interval: float = 5.0
    """How often RDY is recomputed over the connections, default 5.0 (> 0)."""
    low_rdy_idle_timeout: float = 10.0
    """With fewer slots than connections, a connection holding RDY that received nothing for
    this long gives it up; default 10.0 (> 0)."""
    concurrency: int | None = None
    """How many handlers run at once (worker tasks, or threads for a plain ``def`` handler:
    [handlers][consumer-handlers]), an int >= 1; default ``max_in_flight``, kept between 1 and
    100."""
    auto_touch: bool | None = None
    """Whether to TOUCH messages whose handler is still running, from half of nsqd's message
    timeout on ([handlers][consumer-handlers]). ``None`` (default): on Youzan ordered partitions
    only, so that nsqd never hands a slow handler's message out again while it runs
    ([ordered][ordered-slow])."""
    msg_timeout: float | None = None
    """How long nsqd waits for an answer to a message before delivering it again, sent in
    IDENTIFY (nsqd caps it at ``--max-msg-timeout``). Default None: nsqd's ``--msg-timeout``
    (60 s by default)."""
    heartbeat_interval: float = 30.0
    """How often nsqd sends a heartbeat, sent in IDENTIFY: 1 to 60, or -1 to disable. A
    connection silent for two intervals (plus 10 %, at least 0.5 s) is closed and reconnected.
    Default 30.0."""
    on_giving_up: GivingUp | None = None
    """Called with a message that exceeded ``max_attempts``, before it is FINed; may be
    ``async`` (then awaited in the background). Its exceptions are logged. One that takes two
    arguments also gets the reason: None, or the error the ``dead_letter_topic`` refused the
    copy with for good (the message is then finished without a copy). Default None: a warning is
    logged."""
    tls: ssl.SSLContext | bool = False
    """``True`` for TLS with the system's trusted certificates and host name verification, an
    ``ssl.SSLContext`` for your own settings (client certificates, a private CA), ``False``
    (default) for plain TCP."""
    tls_hostname: str | None = None
    """Name the server certificate is checked against; default: the host of the nsqd address."""
    snappy: bool = False
    """Compress the connection with Snappy. Default False."""
    deflate: bool = False
    """Compress the connection with DEFLATE (not together with ``snappy``). Default False."""
    deflate_level: int = 6
    """DEFLATE level, 1 to 9, default 6."""
    auth_secret: str | bytes | None = field(default=None, repr=False)
    """Secret sent with AUTH when nsqd requires authentication. Without TLS it is readable on
    the network: a warning is given once per process (see ``auth_over_plaintext``)."""
    client_id: str | None = None
    """Client id reported to nsqd (shown in its stats); default: the short host name."""
    sample_rate: int = 0
    """Percentage of the channel's messages nsqd delivers to this consumer, 0 to 99; 0 (default)
    delivers all."""
    connect_timeout: float = 5.0
    """Time allowed for the TCP connection to an nsqd, default 5.0."""
    ordered: bool | None = None
    """Youzan ordered topics: ``True`` subscribes with ``SUB_ORDERED`` (one message in flight
    per partition, checked by offset), ``False`` never does, ``None`` (default) follows the
    topic's metadata from lookupd and what nsqd demands."""
    ext: bool | None = None
    """Youzan ext topics (messages with JSON headers): ``True`` negotiates ``extend_support``,
    ``False`` does not, ``None`` (default) follows the topic."""
    on_order_violation: Callable[[Message, int, int], Any] | None = None
    """Called as ``(message, last_internal_id, last_offset)`` when a message of an ordered
    partition goes backwards (logged as an error either way). May be ``async``. Default None."""
    on_blocked: Callable[[Message], Any] | None = None
    """Called with a message of an ordered partition that arrives with at least
    ``blocked_warn_attempts`` attempts (it blocks its partition); may be ``async``. Default
    None."""
    blocked_warn_attempts: int = 10
    """On ordered partitions, a message on this many attempts (and every multiple of it) is
    logged as a warning; an int >= 1, default 10."""
    blocked_error_attempts: int = 50
    """From this many attempts on, that log line is an error; an int >= 1, default 50."""
    auth_over_plaintext: bool = True
    """``False`` refuses to send ``auth_secret`` to an nsqd that asks for it over an unencrypted
    connection: the connection fails with [`InsecureAuth`][smartnsq.errors.InsecureAuth].
    Default True."""
    start: Start = None
    """Where to start reading a Youzan partitioned topic (with ``lookupd_http_addresses``):
    ``None`` (default): the channel's own position; ``"earliest"``, ``"latest"``, a Unix time
    (seconds, or an aware ``datetime``) or ``{partition: queue offset}``. It moves the *channel*
    for every consumer of it, once per partition, before any message is read; see [where a
    consumer starts][consumer-start] for the rules and the errors raised on start."""
    partitions: Iterable[int] | None = None
    """Partition numbers to consume (default: every partition). Needs
    ``lookupd_http_addresses``; checked on start like ``start``."""
    advanced: bool = False
    """Subscribe with ``SUB_ADVANCED`` so every message of an unordered partitioned topic
    carries ``offset`` and ``raw_size`` ([`Message`][smartnsq.Message]; ordered topics always
    do). Implied by ``start``."""
    desired_tag: str | None = None
    """Receive only the messages published with this dispatch tag (Youzan ext topics; 1-100
    ASCII letters, digits, ``_`` or ``-``). Elsewhere the consumer refuses to subscribe
    ([tags][consumer-tags])."""
    output_buffer_timeout: float | None = None
    """How long nsqd may hold messages for this consumer before writing them out, in seconds,
    sent in IDENTIFY. ``None`` (default): nsqd's (250 ms); ``0``: no buffering, each write goes
    out at once (more system calls on both sides); else at least 0.001. nsqd allows 0.025 to 30
    by default (its ``--min/--max-output-buffer-timeout``) and refuses others at IDENTIFY: the
    start raises [`ConfigRefused`][smartnsq.errors.ConfigRefused]. A low value gets messages to
    a consumer at a low rate sooner ([low latency][consumer-latency])."""
    output_buffer_size: int | None = None
    """How many bytes nsqd may buffer for this consumer before writing, sent in IDENTIFY.
    ``None`` (default): nsqd's (16 KiB); ``0``: no buffering (nsqd then also ignores
    ``output_buffer_timeout``); else at least 64 (nsqd's ``--max-output-buffer-size``, 64 KiB by
    default, bounds it)."""
    dead_letter_topic: str | None = None
    """Where a message given up on (past ``max_attempts``) goes: published there, then finished
    once nsqd acknowledged the copy; requeued after a growing delay (without backoff) if that
    publish fails; given up with an ERROR if the topic refuses it for good ([dead
    letters][consumer-dead-letters]). Also on ordered partitions, which then move on past it. On
    the Youzan fork the topic must exist: else the start raises
    [`TopicNotFound`][smartnsq.errors.TopicNotFound]. ``None`` (default): finished."""

    def __post_init__(self) -> None:
        self.topic = validate_topic(self.topic)
        self.channel = validate_channel(self.channel)
        if self.handler is not None and not callable(self.handler):
            raise InvalidType("handler must be a callable taking one Message (or None to pull)")
        direct = check_addresses("nsqd_tcp_addresses", self.nsqd_tcp_addresses)
        for address in direct:
            parse_address(address)
        self.direct = list(dict.fromkeys(direct))
        self.lookupds = check_lookupd_addresses(
            check_addresses("lookupd_http_addresses", self.lookupd_http_addresses)
        )
        if not self.direct and not self.lookupds:
            raise InvalidArgument(
                "Consumer needs nsqd_tcp_addresses or lookupd_http_addresses (or both)"
            )
        if self.dead_letter_topic is not None:
            self.dead_letter_topic = validate_topic(self.dead_letter_topic)
            if self.dead_letter_topic == self.topic:
                raise InvalidArgument(
                    "dead_letter_topic must differ from the topic consumed: messages given up "
                    "on would come straight back"
                )
        check_number("max_in_flight", self.max_in_flight, integer=True, min=0)
        check_number("max_attempts", self.max_attempts, integer=True, min=0)
        if self.dead_letter_topic is not None and self.max_attempts == 0:
            raise InvalidArgument(
                "dead_letter_topic needs max_attempts >= 1: with 0 (no limit) no message is "
                "ever given up, so none would reach the dead-letter topic"
            )
        check_number("requeue_delay", self.requeue_delay, min=0)
        check_number("max_requeue_delay", self.max_requeue_delay, min=0, max=DELAY_LIMIT)
        check_bool("backoff", self.backoff)
        check_number("lookupd_poll_jitter", self.lookupd_poll_jitter)
        check_number("concurrency", self.concurrency, integer=True, allow_none=True)
        check_bool("auto_touch", self.auto_touch, allow_none=True)
        check_bool("ordered", self.ordered, allow_none=True)
        check_bool("ext", self.ext, allow_none=True)
        if self.desired_tag is not None:
            check_tag("desired_tag", self.desired_tag)
            if self.ext is False:
                raise InvalidArgument("desired_tag needs an ext topic: leave ext=None (or True)")
        check_callable("on_order_violation", self.on_order_violation)
        check_callable("on_blocked", self.on_blocked)
        check_number("blocked_warn_attempts", self.blocked_warn_attempts, integer=True, min=1)
        check_number("blocked_error_attempts", self.blocked_error_attempts, integer=True, min=1)
        self.start_plan = StartPlan.from_options(
            self.topic,
            self.channel,
            self.start,
            self.partitions,
            self.advanced,
            self.direct,
            self.lookupds,
        )
        for name in (
            "max_backoff_duration",
            "backoff_unit",
            "lookupd_poll_interval",
            "reconnect_min",
            "reconnect_max",
            "rdy_redistribute_interval",
            "low_rdy_idle_timeout",
        ):
            check_number(name, getattr(self, name), above=0)
        if not 0 <= self.lookupd_poll_jitter < 1:
            raise InvalidArgument("lookupd_poll_jitter must be in [0, 1)")
        if self.concurrency is not None and self.concurrency < 1:
            raise InvalidArgument("concurrency must be >= 1")
        if self.on_giving_up is not None and not callable(self.on_giving_up):
            raise InvalidType("on_giving_up must be callable")
        self.giving_up_reason = self.on_giving_up is not None and takes_reason(self.on_giving_up)
        self.async_handler = self.handler is not None and is_async_handler(self.handler)
        self.reconnect_max = max(self.reconnect_max, self.reconnect_min)
        self.workers = self.concurrency or max(1, min(self.max_in_flight, 100))
        self.config = ConnectionConfig(
            client_id=self.client_id,
            tls=self.tls,
            tls_hostname=self.tls_hostname,
            snappy=self.snappy,
            deflate=self.deflate,
            deflate_level=self.deflate_level,
            auth_secret=self.auth_secret,
            heartbeat_interval=self.heartbeat_interval,
            msg_timeout=self.msg_timeout,
            sample_rate=self.sample_rate,
            connect_timeout=self.connect_timeout,
            auth_over_plaintext=self.auth_over_plaintext,
            output_buffer_size=self.output_buffer_size,
            output_buffer_timeout=self.output_buffer_timeout,
        )
