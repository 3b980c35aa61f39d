"""The consuming front door: :class:`Consumer`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import math
import random
import ssl
import struct
import threading
import time
from collections import deque
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Generator,
    Iterable,
    Sequence,
)
from functools import partial
from types import CoroutineType
from typing import Any

import anyio
import anyio.abc

from smartnsq._checks import (
    DELAY_LIMIT,
    FORKS,
    check_addresses,
    check_bool,
    check_callable,
    check_number,
    check_requeue_delay,
    get_ident,
    owner,
    wrong_owner,
)
from smartnsq.backoff import RESUME, Backoff, Window
from smartnsq.connection import Connection, ConnectionConfig, parse_address
from smartnsq.errors import (
    ConnectionClosed,
    InvalidArgument,
    InvalidType,
    LookupFailed,
    NSQError,
    ProtocolError,
    ServerError,
    SubExtendForbidden,
    SubExtendNeeded,
    SubOrderRequired,
    TagNotSupported,
)
from smartnsq.idle import IdleWorkers
from smartnsq.inbox import Inbox
from smartnsq.lag import ChannelLag, channel_lag
from smartnsq.lookup.client import check_lookupd_addresses
from smartnsq.lookup.manager import LookupManager
from smartnsq.lookup.model import Node
from smartnsq.message import Message, id_text
from smartnsq.notice import handler_failed, topic_missing
from smartnsq.observe.logs import OncePerKind
from smartnsq.observe.stats import ConsumerStats, consumer_stats
from smartnsq.offsets import StartPlan
from smartnsq.ordered.validation import OrderChecker
from smartnsq.protocol import commands
from smartnsq.protocol.compress import maybe_compressed, unpack
from smartnsq.protocol.frames import Span
from smartnsq.protocol.message import CLASSIC, OFFSET_HEAD, MessageLayout, decode_message
from smartnsq.protocol.names import validate_channel, validate_topic
from smartnsq.protocol.offsets import Skip, Start
from smartnsq.protocol.tags import check_tag, check_tag_subscription
from smartnsq.rdy import distribute
from smartnsq.sync_pool import FAILED, GIVE_UP, RETURNED, SyncPool, build_message
from smartnsq.trace import TraceSwitch, emit

log = logging.getLogger("smartnsq.consumer")

#: What a handler may return: None (or anything but False) FINs the message, False REQs it.
#: An awaitable (what an ``async def`` handler, or a plain function forwarding to one,
#: returns) is awaited first and its result counts.
Handler = Callable[[Message], Awaitable[bool | None] | bool | None]
Target = tuple[str, int | None]  # (nsqd tcp address, partition or None)

_CLASSIC = CLASSIC
_unpack_head = struct.Struct(">qH").unpack_from
_PROBE_MOVE = 0.5  # seconds a backoff probe waits on a connection before it moves on
_CALL = 2  # inbox item (_CALL, function, args): a Message method called off the loop


class _Reader:
    """One subscribed connection and its RDY bookkeeping."""

    __slots__ = (
        "address",
        "batch_time",
        "conn",
        "consumer",
        "in_flight",
        "last_message",
        "layout",
        "max_rdy",
        "ordered",
        "partition",
        "rdy",
        "rdy_left",
        "rdy_since",
        "received",
        "skip",
        "straight",
        "write",
    )

    def __init__(
        self,
        consumer: Consumer,
        address: str,
        conn: Connection,
        partition: int | None = None,
        *,
        ordered: bool = False,
        ext: bool = False,
        offsets: bool = False,
    ) -> None:
        self.consumer = consumer
        self.address = address
        self.conn = conn
        self.partition = partition
        self.ordered = ordered
        # Ordered: nothing else to coalesce with; the partition waits for this very answer.
        self.write = conn.raw_write_now if ordered else conn.raw_write
        youzan = conn.features.youzan
        # Deliveries left over from before a start position (see smartnsq.offsets).
        self.skip: Skip | None = None
        if youzan or ordered or ext or offsets:
            self.layout = MessageLayout(binary_id=youzan, ext=ext, offset=ordered or offsets)
        else:
            self.layout = _CLASSIC
        # Whether the ordered hot path (Consumer._on_ordered) suits this reader's messages;
        # Consumer._attach adds the consumer's conditions, _on_ordered those of the moment.
        self.straight = ordered and partition is not None and youzan and not ext
        # An ordered partition delivers one message at a time whatever RDY says.
        self.max_rdy = 1 if ordered else conn.features.max_rdy_count
        self.rdy = 0
        self.rdy_left = 0
        self.in_flight = 0
        self.received = 0
        now = time.monotonic()
        self.last_message = now
        self.rdy_since = now
        self.batch_time = now

    def before_read(self) -> None:
        """Once per batch of received frames: one clock read instead of one per message."""
        self.batch_time = time.monotonic()

    def set_rdy(self, count: int) -> None:
        count = max(0, min(count, self.max_rdy))
        if count == self.rdy and count == self.rdy_left:
            return
        if count != self.rdy:
            self.rdy_since = time.monotonic()
        self.rdy = count
        self.rdy_left = count
        with contextlib.suppress(ConnectionClosed):
            self.conn.queue(commands.rdy(count))


class Consumer:
    """Consumes a channel of a topic from one or more nsqd.

        async def handle(message: Message) -> None:
            ...  # return: FIN; return False or raise: REQ with backoff

        async with Consumer("events", "archive", handle, lookupd_http_addresses=[...]) as c:
            await anyio.sleep_forever()

    The handler's answer, as in pynsq: returning ``None``, ``True`` or anything else but
    ``False`` FINs the message; returning ``False`` REQs it with the consumer's delay policy
    (``requeue_delay`` times the attempts, capped by ``max_requeue_delay``) and counts as a
    failure for backoff, as raising does (the exception is logged with its traceback).
    Whatever the handler returns that is awaitable is awaited first, so a plain function
    that forwards to an ``async def`` one behaves like it.

    ``async def`` handlers run on the event loop, ``concurrency`` at a time. Plain ``def``
    handlers run in a pool of up to ``concurrency`` worker threads (default:
    ``max_in_flight``, at most 100), so a handler that blocks does not stop the event loop
    from answering nsqd's heartbeats; [`Message.finish`][smartnsq.Message.finish] and friends
    may be called from those threads.

    One nsqd or nsqlookupd that fails, in whatever way, is logged, retried with backoff and
    does not stop consumption from the others.

    Or pull messages without a handler:

        async with Consumer("events", "archive", nsqd_tcp_addresses=[...]) as consumer:
            async for message in consumer:
                ...  # finished automatically when the next one is pulled

    Bodies that a Youzan producer compressed itself (go-nsq's ``TopicsForCompress``, or
    ``compress_topics`` of [`smartnsq.Producer`][smartnsq.Producer]) are handed over
    decompressed; as with go-nsq, the headers ``nsq.client.compress`` and ``nsq.msg.size`` stay in
    ``message.headers``. A body that cannot be decompressed (unknown codec, corrupt block)
    never reaches the handler: it fails with [`DecompressFailed`][smartnsq.errors.DecompressFailed]
    and is logged and requeued (given up after ``max_attempts``) like a handler failure.


    A Consumer can be started once, and belongs to the event loop (thread) and process that
    started it: used from another thread it raises
    [`WrongEventLoop`][smartnsq.errors.WrongEventLoop], in a child after ``fork()``
    [`UsedAfterFork`][smartnsq.errors.UsedAfterFork].

    Attributes:
        topic: The topic consumed.
        channel: The channel subscribed to.
        trace: Run-time trace switch ([`TraceSwitch`][smartnsq.trace.TraceSwitch]): while
            tracing is on for the topic, each message received is written as a ``consume``
            trace record.
        last_error: The last error an nsqd refused the subscription with (say, an ordered
            topic subscribed with ``ordered=False``), or None.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        handler: Handler | None = None,
        *,
        nsqd_tcp_addresses: Sequence[str] = (),
        lookupd_http_addresses: Sequence[str] = (),
        max_in_flight: int = 1,
        max_attempts: int = 5,
        requeue_delay: float = 90.0,
        max_requeue_delay: float = 3600.0,
        backoff: bool = True,
        max_backoff_duration: float = 128.0,
        backoff_unit: float = 1.0,
        lookupd_poll_interval: float = 60.0,
        lookupd_poll_jitter: float = 0.3,
        reconnect_min: float = 0.5,
        reconnect_max: float = 60.0,
        rdy_redistribute_interval: float = 5.0,
        low_rdy_idle_timeout: float = 10.0,
        concurrency: int | None = None,
        auto_touch: bool = False,
        msg_timeout: float | None = None,
        heartbeat_interval: float = 30.0,
        on_giving_up: Callable[[Message], Any] | None = None,
        tls: ssl.SSLContext | bool = False,
        tls_hostname: str | None = None,
        snappy: bool = False,
        deflate: bool = False,
        deflate_level: int = 6,
        auth_secret: str | bytes | None = None,
        client_id: str | None = None,
        sample_rate: int = 0,
        connect_timeout: float = 5.0,
        ordered: bool | None = None,
        ext: bool | None = None,
        on_order_violation: Callable[[Message, int, int], Any] | None = None,
        on_blocked: Callable[[Message], Any] | None = None,
        blocked_warn_attempts: int = 10,
        blocked_error_attempts: int = 50,
        auth_over_plaintext: bool = True,
        start: Start = None,
        partitions: Iterable[int] | None = None,
        advanced: bool = False,
        desired_tag: str | None = None,
    ) -> None:
        """Configure a consumer; nothing connects until it is started.

        Start it with ``async with``, [`run`][smartnsq.Consumer.run] or
        [`smartnsq.run`][smartnsq.run]. Every argument is checked here: a wrong type raises
        [`InvalidType`][smartnsq.errors.InvalidType], a value out of range
        [`InvalidArgument`][smartnsq.errors.InvalidArgument]. Times are in seconds.

        Args:
            topic: The topic to consume (NSQ's naming rules: 1-64 characters of
                ``[.a-zA-Z0-9_-]``, optionally ending in ``#ephemeral``).
            channel: The channel to subscribe to (the same rules as ``topic``). Consumers on
                one channel share its messages; each channel gets every message.
            handler: Called with each [`Message`][smartnsq.Message]. An ``async def`` handler
                runs on the event loop, ``concurrency`` at a time; a plain ``def`` handler runs
                in a pool of up to ``concurrency`` worker threads. Returning ``None``, ``True``
                or anything but ``False`` FINs the message; returning ``False`` or raising REQs
                it (the exception is logged with its traceback) and counts as a failure for
                backoff. An awaitable it returns is awaited first. ``None`` (the default):
                no handler; iterate with ``async for message in consumer``.
            nsqd_tcp_addresses: nsqd TCP addresses (``host:port``) to connect to directly.
                Each is kept connected (reconnecting with backoff, see ``reconnect_min``)
                whatever the lookupds say.
            lookupd_http_addresses: nsqlookupd HTTP addresses (``host:port`` or an
                ``http(s)://`` URL). Every lookupd is asked at once, every
                ``lookupd_poll_interval``; the consumer connects to each nsqd that has the
                topic (on Youzan, one connection per partition) and disconnects from the ones
                no lookupd lists any more. At least one of ``nsqd_tcp_addresses`` and
                ``lookupd_http_addresses`` is required.
            max_in_flight: Most messages held at once over all connections (the sum of the
                RDY counts), an int >= 0; 0 pauses. It is spread evenly over the connections;
                with fewer than there are connections, connections take turns holding RDY 1.
                Default 1. Change it at run time with
                [`set_max_in_flight`][smartnsq.Consumer.set_max_in_flight].
            max_attempts: A message delivered more than this many times is not handed to the
                handler: it goes to ``on_giving_up`` (or a warning is logged) and is FINed.
                0 means no limit. Not applied on ordered partitions, where skipping a message
                would break the order. Default 5.
            requeue_delay: Delay of a REQ when the handler fails (or calls
                ``message.requeue()`` without a delay): ``requeue_delay`` times the message's
                attempts, capped by ``max_requeue_delay``. Default 90.0. Ordered partitions
                always requeue with no delay.
            max_requeue_delay: Cap of that delay, default 3600.0 (nsqd caps it at its own
                ``--max-req-timeout`` too).
            backoff: Whether failures slow consumption down. Each failure raises the backoff
                level (each success lowers it); while it is above 0 every connection gets RDY 0
                for a window of ``backoff_unit * 2**level`` seconds (at most
                ``max_backoff_duration``, shortened by up to 20 % at random), then one
                connection gets RDY 1 to test the waters (moved to the next every 0.5 s while
                it has nothing to send). Back at level 0, full RDY resumes. Default True.
            max_backoff_duration: Longest backoff window, default 128.0 (> 0). It also caps the
                level at ``ceil(log2(max_backoff_duration / backoff_unit))``.
            backoff_unit: Length of the level-1 backoff window's unit, default 1.0 (> 0).
            lookupd_poll_interval: Time between two lookupd queries, default 60.0 (> 0),
                varied by ``lookupd_poll_jitter``. A dropped connection triggers an early query
                (at most one a second).
            lookupd_poll_jitter: Each wait between queries is ``lookupd_poll_interval`` times
                a random factor in ``[1 - jitter, 1 + jitter]``; in ``[0, 1)``, default 0.3.
            reconnect_min: Base of the delay before reconnecting to an nsqd, default 0.5
                (> 0): after a connection that ended without an error, ``reconnect_min``;
                after ``n`` failures in a row, ``reconnect_min * 2**n`` (at most
                ``reconnect_max``); each shortened by up to half at random.
            reconnect_max: Longest delay between reconnection attempts, default 60.0 (> 0).
            rdy_redistribute_interval: How often RDY is recomputed over the connections,
                default 5.0 (> 0). With fewer ``max_in_flight`` slots than connections, a
                connection that has held RDY this long gives it to one that waits.
            low_rdy_idle_timeout: With fewer slots than connections, a connection holding RDY
                that received nothing for this long gives it to one that waits; default 10.0
                (> 0).
            concurrency: How many handlers run at once: worker tasks for an ``async def``
                handler, at most this many threads for a plain ``def`` one (threads are added
                only while handlers are stuck). An int >= 1; default ``max_in_flight``, kept
                between 1 and 100.
            auto_touch: Whether to TOUCH messages whose handler is still running: checked
                every second, a message is touched once half of nsqd's message timeout has
                passed since it arrived (or was last touched), until nsqd's
                ``--max-msg-timeout`` since it arrived. Default False.
            msg_timeout: How long nsqd waits for an answer to a message before delivering it
                again, sent in IDENTIFY (nsqd caps it at ``--max-msg-timeout``). Default None:
                nsqd's ``--msg-timeout`` (60 s by default).
            heartbeat_interval: How often nsqd sends a heartbeat, sent in IDENTIFY: 1 to 60,
                or -1 to disable. A connection silent for two intervals (plus 10 %, at least
                0.5 s) is closed and reconnected. Default 30.0.
            on_giving_up: Called with a message that exceeded ``max_attempts``, before it is
                FINed; may be ``async`` (then awaited in the background). Its exceptions are
                logged. Default None: a warning is logged.
            tls: ``True`` for TLS with the system's trusted certificates and host name
                verification, an ``ssl.SSLContext`` for your own settings
                (client certificates, a private CA), ``False`` (default) for plain TCP.
            tls_hostname: Name the server certificate is checked against; default: the host
                of the nsqd address.
            snappy: Compress the connection with Snappy. Default False.
            deflate: Compress the connection with DEFLATE (not together with ``snappy``).
                Default False.
            deflate_level: DEFLATE level, 1 to 9, default 6.
            auth_secret: Secret sent with AUTH when nsqd requires authentication. Without TLS
                it is readable on the network: a warning is given once per process (see
                ``auth_over_plaintext``).
            client_id: Client id reported to nsqd (shown in its stats); default: the short host
                name.
            sample_rate: Percentage of the channel's messages nsqd delivers to this consumer,
                0 to 99; 0 (default) delivers all.
            connect_timeout: Time allowed for the TCP connection to an nsqd, default 5.0.
            ordered: Youzan ordered topics: ``True`` subscribes with ``SUB_ORDERED`` (one
                message in flight per partition, checked by offset), ``False`` never does,
                ``None`` (default) follows the topic's metadata from lookupd and what nsqd
                demands.
            ext: Youzan ext topics (messages with JSON headers): ``True`` negotiates
                ``extend_support``, ``False`` does not, ``None`` (default) follows the topic.
            on_order_violation: Called as ``(message, last_internal_id, last_offset)`` when a
                message of an ordered partition comes before the previous one (its internal
                id or offset went backwards); the violation is logged as an error either way.
                May be ``async``. Default None.
            on_blocked: Called with a message of an ordered partition that arrives with at
                least ``blocked_warn_attempts`` attempts (it blocks its partition). May be
                ``async``. Default None.
            blocked_warn_attempts: On ordered partitions, a message on this many attempts (and
                every multiple of it) is logged as a warning; an int >= 1, default 10.
            blocked_error_attempts: From this many attempts on, that log line is an error;
                an int >= 1, default 50.
            auth_over_plaintext: ``False`` refuses to send ``auth_secret`` to an nsqd that asks
                for it over an unencrypted connection: the connection fails with
                [`InsecureAuth`][smartnsq.errors.InsecureAuth]. Default True.
            start: Where to start reading a Youzan partitioned topic (with
                ``lookupd_http_addresses``): ``None`` (default) reads from the channel's own
                position; ``"earliest"`` from the earliest retained message; ``"latest"`` only
                messages published from now on; a Unix time (int/float seconds, or an aware
                ``datetime``; the fork resolves whole seconds) from the first message published
                at or after that second; a mapping ``{partition: queue offset}`` (offsets as in
                ``Message.offset``) from the first message at or after each offset, other
                partitions keeping the channel's position. It moves the *channel* (nsqd's
                ``/channel/setoffset`` on each partition's leader), so it affects every consumer
                of that channel on that partition; it is applied when this consumer first
                subscribes to a partition, before any message is read, and only if no other
                client is subscribed to the channel there (else a warning is logged and the
                channel's position is kept). It is applied once per partition: a reconnect
                resumes where the channel is. Checked on start: a classic cluster raises
                [`NotSupported`][smartnsq.errors.NotSupported], an unknown partition
                [`InvalidArgument`][smartnsq.errors.InvalidArgument], an offset outside what the
                partition retains [`OffsetOutOfRange`][smartnsq.errors.OffsetOutOfRange].
            partitions: Partition numbers to consume (default: every partition). Needs
                ``lookupd_http_addresses``; checked on start like ``start``.
            advanced: Subscribe with ``SUB_ADVANCED`` so every message of an unordered
                partitioned topic carries ``offset`` and ``raw_size``
                ([`Message`][smartnsq.Message]; ordered topics always do). Implied by ``start``.
            desired_tag: Receive only the messages published with this dispatch tag (Youzan
                ext topics; sent in IDENTIFY). 1-100 ASCII letters, digits, ``_`` or ``-``.
                On a topic without ext headers, or a classic nsqd, which would ignore it and
                deliver everything, the consumer refuses to subscribe
                ([`TagNotSupported`][smartnsq.errors.TagNotSupported], logged and kept in
                ``last_error``).

        Raises:
            InvalidArgument: A value is out of range, a name breaks NSQ's rules, or neither
                ``nsqd_tcp_addresses`` nor ``lookupd_http_addresses`` was given.
            InvalidType: A value has the wrong type.
        """
        self.topic = validate_topic(topic)
        self.channel = validate_channel(channel)
        if handler is not None and not callable(handler):
            raise InvalidType("handler must be a callable taking one Message (or None to pull)")
        nsqd_tcp_addresses = check_addresses("nsqd_tcp_addresses", nsqd_tcp_addresses)
        for address in nsqd_tcp_addresses:
            parse_address(address)
        lookupds = check_lookupd_addresses(
            check_addresses("lookupd_http_addresses", lookupd_http_addresses)
        )
        self._direct = list(dict.fromkeys(nsqd_tcp_addresses))
        if not self._direct and not lookupds:
            raise InvalidArgument(
                "Consumer needs nsqd_tcp_addresses or lookupd_http_addresses (or both)"
            )
        check_number("max_in_flight", max_in_flight, integer=True, min=0)
        check_number("max_attempts", max_attempts, integer=True, min=0)
        check_number("requeue_delay", requeue_delay, min=0)
        check_number("max_requeue_delay", max_requeue_delay, min=0, max=DELAY_LIMIT)
        check_bool("backoff", backoff)
        check_number("lookupd_poll_jitter", lookupd_poll_jitter)
        check_number("concurrency", concurrency, integer=True, allow_none=True)
        check_bool("auto_touch", auto_touch)
        check_bool("ordered", ordered, allow_none=True)
        check_bool("ext", ext, allow_none=True)
        if desired_tag is not None:
            check_tag("desired_tag", desired_tag)
            if ext is False:
                raise InvalidArgument("desired_tag needs an ext topic: leave ext=None (or True)")
        check_callable("on_order_violation", on_order_violation)
        check_callable("on_blocked", on_blocked)
        check_number("blocked_warn_attempts", blocked_warn_attempts, integer=True, min=1)
        check_number("blocked_error_attempts", blocked_error_attempts, integer=True, min=1)
        self._start = StartPlan.from_options(
            self.topic, self.channel, start, partitions, advanced, self._direct, lookupds
        )
        self._partitions = self._start.partitions
        self._nodes: dict[Target, Node] = {}  # partition leaders, for the start's HTTP calls
        _positive(
            max_backoff_duration=max_backoff_duration,
            backoff_unit=backoff_unit,
            lookupd_poll_interval=lookupd_poll_interval,
            reconnect_min=reconnect_min,
            reconnect_max=reconnect_max,
            rdy_redistribute_interval=rdy_redistribute_interval,
            low_rdy_idle_timeout=low_rdy_idle_timeout,
        )
        if not 0 <= lookupd_poll_jitter < 1:
            raise InvalidArgument("lookupd_poll_jitter must be in [0, 1)")
        if concurrency is not None and concurrency < 1:
            raise InvalidArgument("concurrency must be >= 1")
        if on_giving_up is not None and not callable(on_giving_up):
            raise InvalidType("on_giving_up must be callable")
        self._handler = handler
        self._async_handler = handler is not None and _is_async(handler)
        self._max_in_flight = max_in_flight
        self.max_attempts = max_attempts
        self.requeue_delay = requeue_delay
        self.max_requeue_delay = max_requeue_delay
        self._backoff_enabled = backoff
        self._backoff = Backoff(backoff_unit, max_backoff_duration)
        self.lookupd_poll_interval = lookupd_poll_interval
        self.lookupd_poll_jitter = lookupd_poll_jitter
        self.reconnect_min = reconnect_min
        self.reconnect_max = max(reconnect_max, reconnect_min)
        self.rdy_redistribute_interval = rdy_redistribute_interval
        self.low_rdy_idle_timeout = low_rdy_idle_timeout
        self._concurrency = concurrency or max(1, min(max_in_flight, 100))
        self.auto_touch = auto_touch
        self._on_giving_up = on_giving_up
        self._config = ConnectionConfig(
            client_id=client_id,
            tls=tls,
            tls_hostname=tls_hostname,
            snappy=snappy,
            deflate=deflate,
            deflate_level=deflate_level,
            auth_secret=auth_secret,
            heartbeat_interval=heartbeat_interval,
            msg_timeout=msg_timeout,
            sample_rate=sample_rate,
            connect_timeout=connect_timeout,
            auth_over_plaintext=auth_over_plaintext,
        )

        self._readers: dict[Target, _Reader] = {}
        self._wanted: set[Target] = set()  # (nsqd, partition) we keep a connection loop for
        self._loops: dict[Target, anyio.CancelScope] = {}
        self._queue: deque[Message] = deque()
        self._idle = IdleWorkers()
        # What each worker is handling right now (None when idle): for stop() and auto-touch.
        self._slots: list[Message | None] = []
        # Plain def handlers run in threads; their outcomes come back through the inbox.
        self._pool: SyncPool | None = None
        self._inbox: Inbox | None = None
        # Messages whose sync handler returned an awaitable that is being awaited.
        self._awaiting: set[Message] = set()
        self._fin_readers: dict[int, _Reader] = {}  # thread index -> reader its FINs are for
        # Classic reads go here whole, unanswered, instead of to the handler (see
        # _set_raw_sink); None: the handler gets them.
        self._raw_sink: Callable[[_Reader, bytes, list[Span]], None] | None = None
        self._lookup_failures = 0
        self._failures: dict[Target, int] = {}  # failed connection attempts in a row
        self._received = self._finished = self._requeued = self._discarded = 0
        self._tg: anyio.abc.TaskGroup | None = None
        self._workers: anyio.CancelScope | None = None
        self._requery = anyio.Event()
        self._stopped = anyio.Event()
        self._stopping = False
        self._draining: anyio.CancelScope | None = None  # stop()'s wait for running handlers
        self._started = False
        # The thread whose event loop runs it (and the fork generation), set on start: the
        # owner checks, and whether an answer must be carried over from a handler thread.
        self._thread: int | None = None
        self._forks = FORKS[0]
        self._pulled: Message | None = None
        self._lookup = (
            LookupManager(lookupds, listlookup_interval=lookupd_poll_interval) if lookupds else None
        )
        self._ordered_option = ordered
        self._ext_option = ext
        self._ordered = bool(ordered)
        self._ext = bool(ext) or desired_tag is not None  # tags exist only on ext topics
        self._desired_tag = desired_tag
        self.last_error: ServerError | None = None
        self.trace = TraceSwitch()
        self._order: dict[int | None, OrderChecker] = {}
        self._order_violations = 0
        self._on_order_violation = on_order_violation
        self._on_blocked = on_blocked
        self.blocked_warn_attempts = blocked_warn_attempts
        self.blocked_error_attempts = blocked_error_attempts

    # -- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> Consumer:
        if self._started:
            raise NSQError("a Consumer can be started only once")
        await self._start.check()
        self._started = True
        self._thread, self._forks = owner()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._start_tasks(self._tg)
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        try:
            # A pulled message whose loop body ended normally (say, by 'break') was handled.
            await self._stop(10.0, pulled_done=exc_type is None)
        finally:
            assert self._tg is not None
            self._tg.cancel_scope.cancel()
            await self._tg.__aexit__(None, None, None)

    async def run(self) -> None:
        """Start consuming and block until [`stop`][smartnsq.Consumer.stop] is called.

        Call ``stop`` from another task (or a handler), or run the consumer with
        [`smartnsq.run`][smartnsq.run], which stops it on SIGINT or SIGTERM.

        Raises:
            NSQError: The consumer was already started.
        """
        if self._started:
            raise NSQError("a Consumer can be started only once")
        await self._start.check()
        self._started = True
        self._thread, self._forks = owner()
        async with anyio.create_task_group() as tg:
            self._tg = tg
            self._start_tasks(tg)
            await self._stopped.wait()
            tg.cancel_scope.cancel()

    def _start_tasks(self, tg: anyio.abc.TaskGroup) -> None:
        self._inbox = Inbox(self._on_inbox, partial(self._send_all_fins, in_task=False))
        tg.start_soon(self._inbox.run)
        if self._handler is not None and not self._async_handler:
            self._pool = SyncPool(self._handler, self._concurrency, self._inbox, self.max_attempts)
            tg.start_soon(self._watch_pool, self._pool)
        for address in self._direct:
            self._want((address, None))
        if self._lookup is not None:
            tg.start_soon(self._lookup_loop)
        tg.start_soon(self._rdy_loop)
        if self.auto_touch:
            tg.start_soon(self._touch_loop)
        if self._async_handler:
            tg.start_soon(self._run_workers)

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop gracefully; nothing is left in flight.

        Sends RDY 0 everywhere, requeues messages not yet handed to the handler (a
        message pulled with ``async for`` counts as handled and is finished), lets
        running handlers finish for up to ``timeout`` seconds (their messages are then FINed or
        REQed as usual; handlers still running after that are cancelled and their messages
        requeued; a plain ``def`` handler's thread cannot be cancelled, so its message is
        requeued and what the handler returns later is ignored), then sends CLS and closes the
        connections. After nsqd's CLOSE_WAIT it keeps reading for nsqd's output buffer timeout
        (250 ms by default): a message nsqd had taken before it saw RDY 0 can still come, and
        is requeued.

        Called again while a stop is under way, it waits for that stop, cutting its wait for
        running handlers down to ``timeout`` if that is sooner (say, on a second Ctrl-C).

        Args:
            timeout: Seconds running handlers get to finish (>= 0), default 10.0.

        Raises:
            WrongEventLoop: Called from another thread than the one running the consumer.
            UsedAfterFork: Called in a child process after ``fork()``.
        """
        if self._thread != get_ident() or self._forks != FORKS[0]:
            wrong_owner("Consumer", self._thread, self._forks)
        check_number("timeout", timeout, min=0)
        draining = self._draining
        if draining is not None:
            draining.deadline = min(draining.deadline, anyio.current_time() + timeout)
        await self._stop(timeout, pulled_done=True)

    async def _stop(self, timeout: float, pulled_done: bool) -> None:
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        self._backoff.cancel()
        for reader in list(self._readers.values()):
            reader.set_rdy(0)
        while self._queue:  # never started: give them back right away
            self._requeue(self._queue.popleft(), 0, False)
        pool = self._pool
        if pool is not None:
            for (reader, src, _), item in pool.take_unstarted():
                msg = item if src is None else build_message(reader, src, item)
                self._requeue(msg, 0, False)
            pool.close()  # running handlers finish; nothing new starts
        pulled = self._pulled
        if pulled is not None and pulled._auto and not pulled._responded:
            if pulled_done:
                self._finish(pulled)
            else:
                self._requeue(pulled, 0, False)
        with anyio.move_on_after(timeout) as self._draining:
            while self._running() or self._threads_busy():
                await anyio.sleep(0.01)
        self._draining = None
        if self._workers is not None:
            self._workers.cancel()
        if self._inbox is not None:
            self._inbox.drain()  # outcomes already back: answered as the handler said
        # Threads cannot be cancelled: take their messages over (a thread answers only
        # what it still owns) and requeue them.
        running = self._running(threads=False)
        if pool is not None:
            running += pool.steal_running()
        for msg in running:
            if not msg._responded:
                self._requeue(msg, 0, False)
        self._slots = [None] * len(self._slots)
        self._idle.wake_all()
        with anyio.CancelScope(shield=True):
            readers = list(self._readers.values())
            async with anyio.create_task_group() as tg:
                for reader in readers:
                    tg.start_soon(self._close_wait, reader)
            for reader in readers:
                await reader.conn.close(timeout=1.0)
        for scope in self._loops.values():
            scope.cancel()
        self._stopped.set()

    async def _close_wait(self, reader: _Reader) -> None:
        """CLS, then keep reading for one output-buffer period: nsqd's sender may have taken
        a message before it saw RDY 0 and write it after CLOSE_WAIT, to go out when nsqd
        next flushes. It is requeued as it comes (see ``_on_message``); closed without
        reading, it would stay in flight in nsqd until its timeout."""
        conn = reader.conn
        if not conn.usable:
            return
        with anyio.move_on_after(2.0), contextlib.suppress(NSQError):
            await conn.request(commands.CLS, timeout=1.0)
            await anyio.sleep(conn.features.output_buffer_timeout + 0.05)

    # -- public state ----------------------------------------------------------------------------

    @property
    def max_in_flight(self) -> int:
        """The current ``max_in_flight``.

        Change it with [`set_max_in_flight`][smartnsq.Consumer.set_max_in_flight].
        """
        return self._max_in_flight

    def set_max_in_flight(self, value: int) -> None:
        """Change ``max_in_flight`` at run time; 0 pauses consumption.

        RDY is recomputed over the connections at once (lowered first, so the total never
        exceeds the new value).

        Args:
            value: Most messages held at once over all connections, an int >= 0.

        Raises:
            InvalidArgument: ``value`` is negative.
            InvalidType: ``value`` is not an int.
            WrongEventLoop: Called from another thread than the one running the consumer.
        """
        if self._thread != get_ident() or self._forks != FORKS[0]:
            wrong_owner("Consumer", self._thread, self._forks)
        check_number("max_in_flight", value, integer=True, min=0)
        self._max_in_flight = value
        self._redistribute()

    def is_starved(self) -> bool:
        """Whether some connection has used 85 % or more of its RDY on unanswered messages.

        A handler that batches messages (``message.disable_auto_response()`` and answers
        later) should process what it holds when this is True: nsqd sends nothing more on a
        connection whose RDY is used up.

        Returns:
            True when some connection with RDY > 0 has at least 85 % of it in flight.
        """
        return any(r.rdy and r.in_flight >= 0.85 * r.rdy for r in self._readers.values())

    def stats(self) -> ConsumerStats:
        """Counters since the start, and each subscribed connection's RDY and in-flight.

        Returns:
            A [`ConsumerStats`][smartnsq.ConsumerStats] snapshot (``nodes``: per connection).
        """
        counts = self._received, self._finished, self._requeued, self._discarded
        return consumer_stats(*counts, self._backoff.level, list(self._readers.values()))

    async def lag(
        self, *, nsqd_http_addresses: Sequence[str] = (), timeout: float = 10.0
    ) -> list[ChannelLag]:
        """How many messages this channel has not consumed yet, per nsqd (classic) or
        partition (Youzan), as nsqd tells it now (see [`channel_lag`][smartnsq.lag.channel_lag]).

        Args:
            nsqd_http_addresses: nsqd HTTP addresses to ask; needed when the consumer reads
                ``nsqd_tcp_addresses`` without a lookupd (the TCP connection does not tell
                nsqd's HTTP port). With lookupds, the topic's nsqd are found through them.
            timeout: Seconds for the whole call.

        Returns:
            One [`ChannelLag`][smartnsq.lag.ChannelLag] per nsqd or partition.

        Raises:
            InvalidArgument: No lookupd and no ``nsqd_http_addresses`` to ask.
            LookupFailed: No lookupd answered.
            NsqdHttpFailed: No nsqd answered.
        """
        lookupds = self._lookup.seeds if self._lookup is not None else []
        if not lookupds and not nsqd_http_addresses:
            raise InvalidArgument(
                "this Consumer reads nsqd_tcp_addresses without a lookupd: pass lag() their "
                "nsqd_http_addresses (a TCP connection does not tell nsqd's HTTP port)"
            )
        return await channel_lag(
            self.topic,
            self.channel,
            lookupd_http_addresses=lookupds,
            nsqd_http_addresses=nsqd_http_addresses,
            timeout=timeout,
        )

    # -- pulling ---------------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[Message]:
        if self._thread != get_ident() or self._forks != FORKS[0]:
            wrong_owner("Consumer", self._thread, self._forks)
        if self._handler is not None:
            raise NSQError("this Consumer has a handler; iterate only over a handler-less one")
        if not self._started:
            raise NSQError("start the Consumer first: 'async with Consumer(...) as c: async for'")
        return self

    async def __anext__(self) -> Message:
        if self._thread != get_ident() or self._forks != FORKS[0]:
            wrong_owner("Consumer", self._thread, self._forks)
        prev = self._pulled
        if prev is not None and prev._auto and not prev._responded:
            self._finish(prev)
        self._pulled = None
        while not self._queue:
            if self._stopping:
                raise StopAsyncIteration
            await self._idle.wait()
        msg = self._queue.popleft()
        self._pulled = msg
        return msg

    # -- message flow ----------------------------------------------------------------------------

    def _on_messages(self, reader: _Reader, src: bytes, spans: list[Span]) -> None:
        """Every message frame of one read. Counters and RDY are settled once per batch."""
        n = len(spans)
        reader.in_flight += n
        reader.rdy_left -= n
        reader.received += n
        self._received += n
        reader.last_message = reader.batch_time
        # Top up before it runs dry (not an ordered RDY 1: nsqd keeps it, as a window).
        if (
            reader.rdy
            and reader.rdy_left <= reader.rdy >> 2
            and not self._backoff.level
            and not reader.ordered
        ):
            reader.set_rdy(reader.rdy)
        if reader.layout is _CLASSIC and not (
            self._stopping or self.auto_touch or self.trace.active
        ):
            # The whole read to whoever takes reads as they are: the raw sink, or the sync
            # handler's threads, which build the messages themselves.
            whole = self._raw_sink or (self._pool.submit if self._pool is not None else None)
            if whole is not None:
                for _, start, end in spans:
                    if end - start < 26:
                        raise ProtocolError(f"message frame too short ({end - start} bytes)")
                whole(reader, src, spans)
                return
            # Hot path: classic frames straight to the workers' queue.
            append = self._queue.append
            max_attempts = self.max_attempts
            for _, start, end in spans:
                if end - start < 26:
                    raise ProtocolError(f"message frame too short ({end - start} bytes)")
                timestamp, attempts = _unpack_head(src, start)
                mid = src[start + 10 : start + 26]
                msg = Message(timestamp, attempts, mid, src[start + 26 : end])
                msg._reader = reader
                msg._responded = False
                msg._auto = True
                if max_attempts and attempts > max_attempts:
                    self._give_up(msg)
                else:
                    append(msg)
            if self._idle and self._queue:
                self._idle.wake_one()
            return
        batch = []
        for _, start, end in spans:
            msg = decode_message(src[start:end], reader.layout, Message)
            if self._on_message(reader, msg):
                batch.append(msg)
        if batch:
            assert self._pool is not None
            self._pool.submit(reader, None, batch)

    def _attach(self, reader: _Reader, conn: Connection) -> None:
        """Route the message frames of the connection's reads to the reader."""
        if reader.straight and self._async_handler and not self.auto_touch:
            conn.on_messages = partial(self._on_ordered, reader)
            conn.before_read = None  # it reads the clock itself: one call fewer per message
        else:
            conn.on_messages = partial(self._on_messages, reader)
            conn.before_read = reader.before_read

    def _on_ordered(self, reader: _Reader, src: bytes, spans: list[Span]) -> None:
        """``_on_messages`` for an ordered partition's plain messages with an async handler
        (nothing to skip, trace or decompress): decoded in place, the order checked inline,
        and handled now. An ordered partition is round-trip bound: every step counts."""
        reader.batch_time = now = time.monotonic()
        if self._stopping or self.trace.active or reader.skip is not None:
            self._on_messages(reader, src, spans)
            return
        n = len(spans)  # the counters as in _on_messages; an ordered RDY is never topped up
        reader.in_flight += n
        reader.rdy_left -= n
        reader.received += n
        self._received += n
        reader.last_message = now
        checker = self._order.get(reader.partition)
        if checker is None:
            checker = self._order[reader.partition] = OrderChecker()
        warn_at = self.blocked_warn_attempts
        idle = self._idle
        for _, start, end in spans:
            if end - start < 38:
                raise ProtocolError("message frame ends before its offset block")
            timestamp, attempts, internal_id, offset, raw_size = OFFSET_HEAD.unpack_from(src, start)
            msg = Message(
                timestamp,
                attempts,
                src[start + 10 : start + 26],
                src[start + 38 : end],
                0,
                None,
                offset,
                raw_size,
            )
            msg._reader = reader
            msg._responded = False
            msg._auto = True
            if internal_id < checker.last_id or offset < checker.last_offset or attempts >= warn_at:
                self._check_order(reader, msg)  # logs and callbacks
            else:
                checker.last_id = internal_id
                checker.last_offset = offset
            if self._stopping:  # a handler of this read stopped the consumer
                self._requeue(msg, 0, False)
            elif not idle.run_as_worker(self._handle_now, msg):
                self._queue.append(msg)
                if idle:
                    idle.wake_one(eager=True)

    def _on_message(self, reader: _Reader, msg: Message) -> bool:
        """Account for one decoded message; True when it is for the handler threads."""
        msg._reader = reader
        msg._responded = False
        msg._auto = True
        if self.auto_touch:
            msg._received = msg._touched = reader.batch_time
        skip = reader.skip
        if skip is not None:
            if skip.stale(msg.offset, msg.timestamp):
                self._finish(msg, count=False)  # from before the start position
                return False
            if skip.below_offset is None:
                reader.skip = None  # times need not rise: only the first deliveries are suspect
        if reader.ordered:
            self._check_order(reader, msg)
        if self.trace.active and self.trace.enabled(self.topic):
            self._trace(reader, msg)
        if self._stopping:
            self._requeue(msg, 0, False)
            return False
        if self.max_attempts and msg.attempts > self.max_attempts and not reader.ordered:
            self._give_up(msg)
            return False
        if msg.ext is not None and maybe_compressed(msg.ext) and (failed := unpack(msg)):
            self._handler_failed(msg, failed)  # as if the handler had raised it
            return False
        if self._pool is not None:
            return True
        # Ordered: the partition waits for this very answer, so an idle worker's handling
        # runs now, here (or, failing that, the woken worker runs before this returns).
        if (
            reader.ordered
            and self._handler is not None
            and self._idle.run_as_worker(self._handle_now, msg)
        ):
            return False
        self._queue.append(msg)
        if self._idle:
            self._idle.wake_one(eager=reader.ordered)
        return False

    def _check_order(self, reader: _Reader, msg: Message) -> None:
        partition = msg.partition if reader.partition is None else reader.partition
        checker = self._order.get(partition)
        if checker is None:
            checker = self._order[partition] = OrderChecker()
        last_id, last_offset = checker.last_id, checker.last_offset
        if not checker.check(msg.internal_id, msg.offset):
            self._order_violations += 1
            log.error(
                "order violation on %s partition %s: internal id %d / offset %s after %d / %d",
                self.topic,
                partition,
                msg.internal_id,
                msg.offset,
                last_id,
                last_offset,
            )
            if self._on_order_violation is not None:
                self._callback(self._on_order_violation, msg, last_id, last_offset)
        attempts = msg.attempts
        if attempts >= self.blocked_warn_attempts:
            level = logging.ERROR if attempts >= self.blocked_error_attempts else logging.WARNING
            if attempts in (self.blocked_warn_attempts, self.blocked_error_attempts) or (
                attempts % self.blocked_warn_attempts == 0
            ):
                log.log(
                    level,
                    "ordered partition %s of %s is blocked: message %s is on attempt %d",
                    partition,
                    self.topic,
                    id_text(msg),
                    attempts,
                )
            if self._on_blocked is not None:
                self._callback(self._on_blocked, msg)

    def _callback(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            result = fn(*args)
            if inspect.isawaitable(result) and self._tg is not None:
                self._tg.start_soon(_await, result)
        except Exception:
            log.exception("callback %r failed", fn)

    def _trace(self, reader: _Reader, msg: Message) -> None:
        youzan = reader.layout.binary_id
        emit(
            "consume",
            topic=self.topic,
            channel=self.channel,
            partition=msg.partition,
            internal_id=msg.internal_id if youzan else None,
            trace_id=msg.trace_id if youzan else None,
            message_id=msg.id.hex(),
            offset=msg.offset,
            size=msg.raw_size,
            attempts=msg.attempts,
            local=reader.conn.local_address,
            nsqd=reader.address,
        )

    def _running(self, threads: bool = True) -> list[Message]:
        running = [m for m in self._slots if m is not None]
        if threads and self._pool is not None:
            running += self._pool.running()
        if self._awaiting:
            running += self._awaiting
        return running

    def _threads_busy(self) -> bool:
        """Some handler thread is running, or its outcome has not been dealt with yet."""
        pool = self._pool
        if pool is not None and (pool.active or any(pool.fins)):
            return True
        return self._inbox is not None and len(self._inbox) > 0

    # -- handler threads -------------------------------------------------------------------------

    async def _watch_pool(self, pool: SyncPool) -> None:
        """Add threads when handlers are stuck; collect outcomes threads have not sent."""
        inbox = self._inbox
        assert inbox is not None
        while not pool.closed:
            await anyio.sleep(0.01 if pool.backlog else 0.05)
            pool.check()
            inbox.drain()

    def _on_inbox(self, items: deque[Any]) -> None:
        """On the loop: what handler threads sent back since the last call, in order
        (calls from a thread before the FINs they may precede)."""
        popleft = items.popleft
        while items:
            kind, target, value = popleft()
            if kind == RETURNED:
                self._handler_returned(target, value)
            elif kind == FAILED:
                self._handler_failed(target, value)
            elif kind == GIVE_UP:
                self._give_up(target)
            else:  # _CALL: finish(), requeue() or touch() from a thread
                try:
                    target(*value)
                except NSQError as exc:  # say, answered twice; the thread cannot be told
                    log.warning("%s", exc)
        self._send_all_fins(in_task=True)

    def _send_all_fins(self, in_task: bool) -> bool:
        """Write the FINs handler threads queued; False when that needs a task (the backoff
        bookkeeping may start one)."""
        if self._backoff.level and not in_task:
            return False
        pool = self._pool
        if pool is not None:
            for index, fins in enumerate(pool.fins):
                if fins:
                    self._send_fins(index, fins)
        return True

    def _send_fins(self, index: int, fins: deque[Any]) -> None:
        """One FIN command per run of ids a thread queued for one connection."""
        reader = self._fin_readers.get(index)
        ids: list[bytes] = []
        popleft = fins.popleft
        while True:
            try:
                item = popleft()
            except IndexError:
                break
            if type(item) is bytes:
                ids.append(item)
                continue
            if ids and reader is not None:
                self._write_fins(reader, ids)
                ids = []
            reader = self._fin_readers[index] = item
        if ids and reader is not None:
            self._write_fins(reader, ids)

    def _write_fins(self, reader: _Reader, ids: list[bytes]) -> None:
        n = len(ids)
        if self._write_answers(reader, ids, b"FIN ", b"\n", "finish"):
            self._finished += n
        if self._backoff.level:
            for _ in range(n):
                self._backoff_result(success=True)

    def _write_answers(
        self, reader: _Reader, ids: list[bytes], head: bytes, tail: bytes, what: str
    ) -> bool:
        """One write of ``head + id + tail`` for each id received on ``reader``; False when
        its connection is gone (nsqd redelivers them)."""
        reader.in_flight -= len(ids)
        try:
            reader.write(head + (tail + head).join(ids) + tail)
        except ConnectionClosed:
            log.debug(  # the lost connection itself is logged once
                "could not %s %d messages: connection to %s is gone; nsqd will redeliver",
                what,
                len(ids),
                reader.address,
            )
            return False
        return True

    # -- raw reads (smartnsq.spark's Feed) --------------------------------------------------------

    def _set_raw_sink(self, sink: Callable[[_Reader, bytes, list[Span]], None]) -> None:
        """Hand classic reads to ``sink`` on the loop: the reader, the read buffer and its
        message frames' spans, each frame's data being ``[timestamp][attempts][id][body]``.
        No Message is made and nothing is answered or counted against ``max_attempts``: the
        caller answers every id with :meth:`_write_fins` or :meth:`_write_requeues`, on the
        loop. Messages that arrive while the consumer stops go to the handler as usual."""
        self._raw_sink = sink

    def _write_requeues(self, reader: _Reader, ids: list[bytes]) -> None:
        """REQ ``ids`` (received on ``reader``) for redelivery now, in one write."""
        if self._write_answers(reader, ids, b"REQ ", b" 0\n", "requeue"):
            self._requeued += len(ids)

    def _write_touches(self, reader: _Reader, ids: list[bytes]) -> None:
        """TOUCH ``ids`` (received on ``reader``) in one write."""
        with contextlib.suppress(ConnectionClosed):
            reader.write(b"TOUCH " + b"\nTOUCH ".join(ids) + b"\n")

    def _on_loop(self) -> bool:
        return threading.get_ident() == self._thread

    def _touch_unless_answered(self, msg: Message) -> None:
        if not msg._responded:
            self._touch(msg)

    def _from_anywhere(self, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn`` now on the loop's thread, or carry it over there from another one."""
        if threading.get_ident() == self._thread:
            fn(*args)
            return
        inbox = self._inbox
        if inbox is None:
            raise NSQError("the consumer is not running")
        inbox.put((_CALL, fn, args))

    def _handler_returned(self, msg: Message, value: Any) -> None:
        if inspect.isawaitable(value):
            if self._tg is None:
                return
            self._awaiting.add(msg)
            self._tg.start_soon(self._settle, msg, value)
        elif msg._auto and not msg._responded:
            if value is False:
                self._requeue(msg, None, True)
            else:
                self._finish(msg)

    async def _settle(self, msg: Message, awaitable: Awaitable[Any]) -> None:
        """Await what a plain function handler returned, then answer as for its result."""
        try:
            value = await awaitable
        except Exception as exc:
            self._handler_failed(msg, exc)
        else:
            self._handler_returned(msg, value)
        finally:
            self._awaiting.discard(msg)

    def _handle_now(self, msg: Message) -> _Job | None:
        """A worker's handling of ``msg``, run as that worker by ``IdleWorkers.run_as_worker``
        in the read callback; a handler that has to wait is returned, for the worker."""
        try:
            coro = self._handler(msg)  # type: ignore[misc]  # set wherever this runs
            if type(coro) is CoroutineType:
                try:
                    step = coro.send(None)
                except StopIteration as stop:
                    value = stop.value
                else:
                    return msg, coro, step
            else:
                value = coro
            if value is not None and inspect.isawaitable(value):
                return msg, None, value
        except Exception as exc:
            self._handler_failed(msg, exc)
        except anyio.get_cancelled_exc_class():
            # Raised to the worker, as if it had run the handler (not into the event loop).
            cancelled = asyncio.get_running_loop().create_future()
            cancelled.cancel()
            return msg, None, cancelled
        else:
            self._answer(msg, value)
        return None

    async def _take_over(self, slot: int, job: _Job) -> None:
        """Finish a handling that ``_handle_now`` began and that had to wait."""
        msg, coro, value = job
        self._slots[slot] = msg
        try:
            value = await (value if coro is None else _Resume(coro, value))
            while value is not None and inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            self._handler_failed(msg, exc)
        else:
            self._answer(msg, value)
        self._slots[slot] = None

    def _answer(self, msg: Message, value: Any) -> None:
        """What a worker does once the handler has returned ``value`` (inlined in
        ``_worker``, which runs it for every message)."""
        if value is False:
            if msg._auto and not msg._responded:
                self._requeue(msg, None, True)
        elif msg._auto and not msg._responded:
            msg._responded = True
            reader = msg._reader
            reader.in_flight -= 1
            try:
                reader.write(b"FIN %s\n" % msg.id)
            except ConnectionClosed:
                self._answer_lost(msg, "finish")
            else:
                self._finished += 1
            if self._backoff.level:
                self._backoff_result(success=True)

    async def _run_workers(self) -> None:
        self._slots = [None] * self._concurrency
        with anyio.CancelScope() as scope:
            self._workers = scope
            async with anyio.create_task_group() as tg:
                for slot in range(self._concurrency):
                    tg.start_soon(self._worker, slot)

    async def _worker(self, slot: int) -> None:
        # The async-handler hot path: no task, future or event per message. The handler's
        # coroutine is stepped here, in this worker's own task (exactly what ``await`` does);
        # a handler that finishes without suspending costs no trip through the event loop, and
        # one that suspends first lets an idle sibling take over the queue.
        queue = self._queue
        popleft = queue.popleft
        idle = self._idle
        slots = self._slots
        handler = self._handler
        assert handler is not None
        while not self._stopping:
            if not queue:
                job = await idle.wait()
                if job is not None:
                    await self._take_over(slot, job)
                continue
            msg = popleft()
            slots[slot] = msg
            try:
                coro = handler(msg)
                if type(coro) is CoroutineType:
                    try:
                        step = coro.send(None)
                    except StopIteration as stop:
                        value = stop.value
                    else:
                        if queue and idle:
                            idle.wake_one()
                        value = await _Resume(coro, step)
                else:
                    value = coro
                while value is not None and inspect.isawaitable(value):
                    value = await value  # returned, rather than awaited, by the handler
            except Exception as exc:
                self._handler_failed(msg, exc)
            else:
                if value is False:
                    if msg._auto and not msg._responded:
                        self._requeue(msg, None, True)
                elif msg._auto and not msg._responded:
                    # _finish inlined: this runs once per message
                    msg._responded = True
                    reader = msg._reader
                    reader.in_flight -= 1
                    try:
                        reader.write(b"FIN %s\n" % msg.id)
                    except ConnectionClosed:
                        self._answer_lost(msg, "finish")
                    else:
                        self._finished += 1
                    if self._backoff.level:
                        self._backoff_result(success=True)
            slots[slot] = None

    def _handler_failed(self, msg: Message, exc: BaseException) -> None:
        log.warning(
            "handler failed for message %s (attempt %d): %r",
            id_text(msg),
            msg.attempts,
            exc,
            exc_info=exc,
        )
        handler_failed(log, f"message {id_text(msg)}, attempt {msg.attempts}", exc)
        if msg._auto and not msg._responded:
            self._requeue(msg, None, True)

    def _give_up(self, msg: Message) -> None:
        self._discarded += 1
        callback = self._on_giving_up
        try:
            if callback is None:
                log.warning(
                    "giving up on message %s after %d attempts (max_attempts=%d); finishing it",
                    id_text(msg),
                    msg.attempts,
                    self.max_attempts,
                )
            else:
                result = callback(msg)
                if inspect.isawaitable(result) and self._tg is not None:
                    self._tg.start_soon(_await, result)
        except Exception:
            log.exception("on_giving_up callback failed for message %s", id_text(msg))
        if not msg._responded:
            self._finish(msg, count=False)

    def _respond(self, msg: Message, command: bytes) -> bool:
        """Send an answer; False when its connection is gone (nsqd will redeliver)."""
        if msg._responded:
            raise NSQError(f"message {id_text(msg)} was already answered")
        msg._responded = True
        reader = msg._reader
        reader.in_flight -= 1
        try:
            reader.write(command)
        except ConnectionClosed:
            self._answer_lost(msg, "answer")
            return False
        return True

    @staticmethod
    def _answer_lost(msg: Message, what: str) -> None:
        log.debug(  # per message; the lost connection itself is logged once
            "could not %s message %s: connection to %s is gone; nsqd will redeliver it",
            what,
            id_text(msg),
            msg._reader.address,
        )

    def _finish(self, msg: Message, count: bool = True) -> None:
        # _respond inlined: this runs once per message.
        if msg._responded:
            raise NSQError(f"message {id_text(msg)} was already answered")
        msg._responded = True
        reader = msg._reader
        reader.in_flight -= 1
        try:
            reader.write(b"FIN %s\n" % msg.id)
        except ConnectionClosed:
            self._answer_lost(msg, "finish")
        else:
            if count:
                self._finished += 1
        if self._backoff.level and count:
            self._backoff_result(success=True)

    def _requeue(self, msg: Message, delay: float | None, backoff: bool) -> None:
        if msg._reader.ordered:
            delay = 0  # an ordered channel ignores REQ delays: the message must come back now
        elif delay is None:
            delay = min(self.requeue_delay * msg.attempts, self.max_requeue_delay)
        else:
            delay = check_requeue_delay(delay)
        assert delay is not None
        if self._respond(msg, commands.req(msg.id, int(delay * 1000))):
            self._requeued += 1
        if backoff and self._backoff_enabled and not self._stopping:
            self._backoff_result(success=False)

    def _touch(self, msg: Message) -> None:
        if msg._responded:
            raise NSQError(f"message {id_text(msg)} was already answered")
        msg._touched = time.monotonic()
        with contextlib.suppress(ConnectionClosed):
            msg._reader.conn.queue(commands.touch(msg.id))

    # -- backoff ---------------------------------------------------------------------------------

    def _backoff_result(self, success: bool) -> None:
        """Count one handler result (see smartnsq.backoff) and do what it asks."""
        if self._stopping:
            return
        step = self._backoff.result(success)
        if step is None:
            return
        if step == RESUME:
            log.info("backoff over; resuming full RDY")
            self._redistribute()
            return
        assert isinstance(step, Window)
        for reader in self._readers.values():
            reader.set_rdy(0)
        log.log(
            logging.INFO if step.entering else logging.DEBUG,
            "backing off for %.2fs (level %d)",
            step.interval,
            self._backoff.level,
        )
        if self._tg is not None:
            self._tg.start_soon(self._end_backoff_window, step.interval, step.epoch)

    async def _end_backoff_window(self, interval: float, epoch: int) -> None:
        await anyio.sleep(interval)
        if self._stopping or not self._backoff.window_over(epoch):
            return
        # Test the waters with one message. Only its result ends the backoff, so while the
        # connection given RDY 1 has nothing to send (an empty partition, an idle nsqd),
        # the probe moves on to the others in turn.
        backoff = self._backoff
        turn = random.randrange(1 << 16)
        while not self._stopping and self._max_in_flight and backoff.epoch == epoch:
            readers = [r for r in self._readers.values() if r.conn.usable]
            if not backoff.level or not readers:
                return  # resumed (RESUME redistributed), or nobody to ask
            reader = readers[turn % len(readers)]
            turn += 1
            received = reader.received
            reader.set_rdy(1)
            await anyio.sleep(_PROBE_MOVE)
            if reader.received != received or backoff.epoch != epoch or not backoff.level:
                return  # a message came: its result decides
            reader.set_rdy(0)

    # -- RDY -------------------------------------------------------------------------------------

    def _redistribute(self) -> None:
        if self._stopping:
            return
        readers = [r for r in self._readers.values() if r.conn.usable]
        if not readers:
            return
        if self._backoff.level:
            if self._max_in_flight == 0:
                for r in readers:
                    r.set_rdy(0)
            return  # the backoff window decides
        now = time.monotonic()
        targets = distribute(
            self._max_in_flight,
            [(r.rdy, r.max_rdy, now - r.last_message, now - r.rdy_since) for r in readers],
            low_rdy_idle_timeout=self.low_rdy_idle_timeout,
            rotate_after=self.rdy_redistribute_interval,
        )
        # Lower first, then raise: the RDY we hand out never sums above max_in_flight.
        for target, reader in sorted(
            zip(targets, readers, strict=True), key=lambda t: t[0] - t[1].rdy
        ):
            if target != reader.rdy:
                reader.set_rdy(target)

    async def _rdy_loop(self) -> None:
        while True:
            await anyio.sleep(self.rdy_redistribute_interval)
            self._redistribute()

    async def _touch_loop(self) -> None:
        while True:
            await anyio.sleep(1.0)
            now = time.monotonic()
            for msg in self._running():
                reader = msg._reader
                features = reader.conn.features
                if msg._responded or now - msg._received >= features.max_msg_timeout:
                    continue
                if now - msg._touched >= features.msg_timeout / 2:
                    with contextlib.suppress(NSQError):  # a handler thread just answered it
                        self._touch(msg)

    # -- connections -----------------------------------------------------------------------------

    def _want(self, target: Target) -> None:
        if target in self._wanted or self._tg is None:
            return
        self._wanted.add(target)
        self._tg.start_soon(self._connection_loop, target)

    def _unwant(self, target: Target) -> None:
        self._wanted.discard(target)
        scope = self._loops.pop(target, None)
        if scope is not None:
            scope.cancel()

    async def _connection_loop(self, target: Target) -> None:
        # One WARNING when a connection is lost (or the first attempt fails), DEBUG for the
        # attempts after it, INFO when subscribed again (_connect_and_consume resets it).
        name = _target_name(target)
        with anyio.CancelScope() as scope:
            self._loops[target] = scope
            while target in self._wanted and not self._stopping:
                try:
                    await self._connect_and_consume(target)
                    failures = self._failures[target] = 0
                except (
                    SubOrderRequired,
                    SubExtendNeeded,
                    SubExtendForbidden,
                    TagNotSupported,
                ) as exc:
                    failures = self._failures[target] = self._failures.get(target, 0) + 1
                    if self._adapt(exc):
                        log.warning("nsqd %s: %s; switching subscription mode", name, exc)
                        self._failures[target] = 0
                        continue
                    self.last_error = exc
                    level = logging.ERROR if failures == 1 else logging.DEBUG
                    log.log(level, "nsqd %s refuses the subscription: %s", name, _explain(exc))
                except Exception as exc:  # one bad node must not stop the rest
                    failures = self._failures[target] = self._failures.get(target, 0) + 1
                    level = logging.WARNING if failures == 1 else logging.DEBUG
                    expected = isinstance(exc, NSQError | OSError)
                    log.log(
                        level,
                        "nsqd %s: %s; reconnecting (attempt %d; logged once until it recovers)",
                        name,
                        exc if expected else repr(exc),
                        failures,
                        exc_info=None if expected else exc,
                    )
                if self._stopping or target not in self._wanted:
                    break
                if self._lookup is not None:
                    self._requery.set()
                delay = min(self.reconnect_max, self.reconnect_min * 2 ** min(failures, 16))
                await anyio.sleep(delay * random.uniform(0.5, 1.0))
        if self._loops.get(target) is scope:
            del self._loops[target]
            self._failures.pop(target, None)

    def _adapt(self, exc: ServerError) -> bool:
        """With ``ordered``/``ext`` left to the topic (None), follow what the server demands."""
        if isinstance(exc, SubOrderRequired) and self._ordered_option is None:
            self._ordered = True
            return True
        if isinstance(exc, SubExtendNeeded | SubExtendForbidden) and self._ext_option is None:
            self._ext = isinstance(exc, SubExtendNeeded)
            return True
        return False

    async def _connect_and_consume(self, target: Target) -> None:
        address, partition = target
        ordered, ext = self._ordered, self._ext
        config = self._config
        tag = self._desired_tag
        if ext:
            extra = {} if tag is None else {"desired_tag": tag}
            config = dataclasses.replace(config, extend_support=True, identify_extra=extra)
        start = self._start
        # SUB_ADVANCED with 4 tokens: a 5th (its own start) would make nsqd ignore the partition.
        advanced = not ordered and start.advanced
        conn = await Connection.open(address, config)
        if tag is not None and not (conn.features.youzan and ext):
            await conn.close(timeout=0)
            check_tag_subscription(self.topic, tag, conn.features.youzan, ext)
        reader = _Reader(self, address, conn, partition, ordered=ordered, ext=ext, offsets=advanced)
        self._attach(reader, conn)
        conn.on_async_error = OncePerKind(log, address)
        sub = (
            commands.sub_ordered if ordered else commands.sub_advanced if advanced else commands.sub
        )
        refused: NSQError | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(conn.run)
                try:
                    await conn.request(sub(self.topic, self.channel, partition), timeout=10)
                    if partition is not None and start.pending(partition):
                        # Before any RDY: nothing is delivered from the old position.
                        reader.skip = await start.apply(partition, self._nodes[target])
                except NSQError as exc:  # raised plainly, not wrapped in a task-group error
                    refused = exc
                    tg.cancel_scope.cancel()
                    return
                self._readers[target] = reader
                failed = self._failures.pop(target, 0)
                log.info(
                    "subscribed to %s/%s on nsqd %s%s%s",
                    self.topic,
                    self.channel,
                    _target_name(target),
                    " (ordered)" if ordered else "",
                    f" again after {failed} failed attempts" if failed else "",
                )
                if not self._backoff.level and self._max_in_flight:
                    reader.set_rdy(1)  # prove the connection before giving it a full share
                self._redistribute()
        finally:
            if self._readers.get(target) is reader:
                del self._readers[target]
            if not conn.closed:
                with anyio.CancelScope(shield=True):
                    await conn.close(timeout=0)
            self._redistribute()
            if refused is not None:
                raise refused
        reason = conn.close_reason
        if not self._stopping and reason is not None:
            raise reason if isinstance(reason, NSQError) else ConnectionClosed(str(reason))

    # -- lookupd ---------------------------------------------------------------------------------

    async def _lookup_loop(self) -> None:
        assert self._lookup is not None
        async with self._lookup:
            last = -math.inf
            while not self._stopping:
                # Rate limit: re-queries triggered by dropped connections wait at least 1 s.
                await anyio.sleep(max(0.0, last + 1.0 - anyio.current_time()))
                last = anyio.current_time()
                self._requery = anyio.Event()
                await self._query_lookupds()
                j = self.lookupd_poll_jitter
                with anyio.move_on_after(self.lookupd_poll_interval * random.uniform(1 - j, 1 + j)):
                    await self._requery.wait()

    async def _query_lookupds(self) -> None:
        """Ask every lookupd at once; connect to new nsqd, drop those no lookupd lists.

        Whatever goes wrong, the nsqd we have stay connected and the next poll tries again.
        """
        try:
            await self._apply_lookup()
        except LookupFailed as exc:  # every lookupd down: keep what we have
            log.debug("lookup of %s failed: %s", self.topic, exc)
        except Exception as exc:  # a bad answer must not stop consuming
            self._lookup_failures += 1
            level = logging.WARNING if self._lookup_failures == 1 else logging.DEBUG
            log.log(level, "lookup of %s failed: %r", self.topic, exc, exc_info=exc)
        else:
            if self._lookup_failures:
                log.info("lookup of %s works again", self.topic)
            self._lookup_failures = 0

    async def _apply_lookup(self) -> None:
        assert self._lookup is not None
        layout = await self._lookup.lookup(self.topic, "r")
        if layout.meta is not None and layout.meta.partition_num:
            if self._ordered_option is None:
                self._ordered = layout.meta.ordered
            if self._ext_option is None:
                self._ext = layout.meta.extend_support
        found: set[Target]
        if layout.partitions:
            wanted = self._partitions
            found = set()
            for p, node in layout.partitions.items():
                if wanted is None or p in wanted:
                    found.add((node.tcp_address, p))
                    self._nodes[(node.tcp_address, p)] = node
        else:
            found = {(node.tcp_address, None) for node in layout.producers}
        if not found and not self._direct:
            topic_missing(log, self.topic, self.channel, self.lookupd_poll_interval)
        for target in found:
            self._want(target)
        for target in list(self._wanted):
            if target not in found and target[0] not in self._direct:
                log.info(
                    "nsqd %s no longer listed for %s; disconnecting",
                    _target_name(target),
                    self.topic,
                )
                self._unwant(target)


def _target_name(target: Target) -> str:
    address, partition = target
    return address if partition is None else f"{address} partition {partition}"


def _explain(exc: ServerError) -> str:
    if isinstance(exc, SubOrderRequired):
        return f"{exc}: the topic is ordered; use ordered=True (or leave ordered=None)"
    if isinstance(exc, SubExtendNeeded):
        return f"{exc}: the topic carries ext headers; use ext=True (or leave ext=None)"
    if isinstance(exc, TagNotSupported):
        return str(exc)
    return f"{exc}: the topic has no ext headers; use ext=False (or leave ext=None)"


# A handling begun in the read callback that has to wait: the message, and the handler's
# coroutine with what it yielded (or None with the awaitable a plain function returned).
_Job = tuple[Message, Coroutine[Any, Any, Any] | None, Any]


class _Resume:
    """Awaitable that continues a coroutine whose first step already ran (and yielded
    ``step``): it hands each yielded value to the running task and forwards what the task
    sends or throws back, as ``await coro`` would have."""

    __slots__ = ("coro", "step")

    def __init__(self, coro: Coroutine[Any, Any, Any], step: Any) -> None:
        self.coro = coro
        self.step = step

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, value = self.coro, self.step
        while True:
            try:
                sent = yield value
            except BaseException as exc:  # cancellation, GeneratorExit on close()
                try:
                    value = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    value = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


async def _await(awaitable: Awaitable[Any]) -> None:
    try:
        await awaitable
    except Exception:
        log.exception("on_giving_up callback failed")


def _is_async(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def _positive(**values: float) -> None:
    for name, value in values.items():
        check_number(name, value, above=0)
