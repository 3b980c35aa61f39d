"""The blocking consuming front door: :class:`Consumer` for code that is not async.

It runs the async :class:`smartnsq.Consumer` (RDY, backoff, heartbeats, ordered partitions,
graceful stop: one implementation) on an event loop in a background thread, and hands
reads to the user's thread through the async consumer's sinks (that thread makes their
messages): nothing waits on the loop for the user's thread, and answers from it reach the
loop in batches.
"""

from __future__ import annotations

import logging
import queue
import signal
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from types import FrameType
from typing import Any

import anyio
from anyio.from_thread import BlockingPortal, start_blocking_portal

from smartnsq._checks import check_number
from smartnsq.consumer import Consumer as AsyncConsumer
from smartnsq.consumer import Handler
from smartnsq.consumer.message import Message
from smartnsq.consumer.options import GivingUp
from smartnsq.errors import InvalidType, NSQError
from smartnsq.lag import ChannelLag, consumer_lag
from smartnsq.protocol.offsets import Start
from smartnsq.stats import ConsumerStats

# A handled message's FIN waits for the rest of its burst only while the loop body, from
# the moment it got that message, has taken less than this (seconds).
SETTLE_AFTER = 0.002

log = logging.getLogger("smartnsq.consumer")


class Consumer:
    """Consumes a channel of a topic from plain (non-async) code.

    Iterate:

        with Consumer("events", "archive", lookupd_http_addresses=[...]) as consumer:
            for message in consumer:
                ...   # FINed when the next one is taken (or when the block ends normally)

    or give a handler and block in [`run`][smartnsq.sync.Consumer.run] (until
    [`stop`][smartnsq.sync.Consumer.stop], Ctrl-C or SIGTERM):

        Consumer("events", "archive", handle, lookupd_http_addresses=[...]).run()

    The arguments are [`smartnsq.Consumer`][smartnsq.Consumer]'s, and so is the contract:
    RDY and backoff,
    heartbeats answered while your code runs, a graceful stop that loses nothing, ordered
    partitions on Youzan, and ``start``/``partitions``/``advanced`` (a bad one raises in
    :meth:`start`, before anything is sent). While iterating, an exception that leaves the
    ``with`` block requeues the message being handled (and every message not yet handed
    over); leaving the loop early (``break``) counts the current message as handled.
    ``message.finish()``, ``requeue()`` and ``touch()`` may be called from this thread.

    Attributes:
        topic: The topic consumed.
        channel: The channel subscribed to.
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
        auto_touch: bool | None = None,
        msg_timeout: float | None = None,
        heartbeat_interval: float = 30.0,
        on_giving_up: GivingUp | None = None,
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
        output_buffer_timeout: float | None = None,
        output_buffer_size: int | None = None,
        dead_letter_topic: str | None = None,
    ) -> None:
        """Configure a consumer; nothing connects until [`start`][smartnsq.sync.Consumer.start].

        Args:
            topic: The topic to consume.
            channel: The channel to subscribe to.
            handler: Called with each [`Message`][smartnsq.Message] by
                [`run`][smartnsq.sync.Consumer.run], in worker threads for a plain ``def``
                (the same return contract as [`smartnsq.Consumer`][smartnsq.Consumer]: ``False``
                or raising requeues). ``None`` (default): iterate with ``for message in
                consumer``.
            nsqd_tcp_addresses: nsqd TCP addresses (``host:port``) to connect to directly. Each is
                kept connected (reconnecting with backoff, see ``reconnect_min``) whatever the
                lookupds say.
            lookupd_http_addresses: nsqlookupd HTTP addresses (``host:port`` or an ``http(s)://``
                URL), all asked at once; the consumer follows the nsqd they list
                ([discovery][consumer-discovery]). At least one of ``nsqd_tcp_addresses`` and
                ``lookupd_http_addresses`` is required.
            max_in_flight: Most messages held at once over all connections (the sum of the RDY
                counts, [spread][consumer-rdy-backoff] over them), an int >= 0; 0 pauses. Default 1.
                Change it with [`set_max_in_flight`][smartnsq.Consumer.set_max_in_flight].
            max_attempts: A message delivered more than this many times is not handed to the
                handler: it goes to ``on_giving_up`` (or a warning is logged) and is FINed. 0 means
                no limit (not with a ``dead_letter_topic``). Not applied on ordered partitions,
                where skipping a message would break the order, unless there is a
                ``dead_letter_topic``. Default 5.
            requeue_delay: Delay of a REQ when the handler fails (or calls ``message.requeue()``
                without a delay): ``requeue_delay`` times the message's attempts, capped by
                ``max_requeue_delay``. Default 90.0. Ordered partitions always requeue with no
                delay.
            max_requeue_delay: Cap of that delay, default 3600.0 (nsqd caps it at its own
                ``--max-req-timeout`` too).
            backoff: Whether failures slow consumption down: RDY 0 for a window that doubles with
                each failure, then RDY 1 to test the waters ([backoff][consumer-rdy-backoff]).
                Default True.
            max_backoff_duration: Longest backoff window, default 128.0 (> 0).
            backoff_unit: Length of the level-1 backoff window's unit, default 1.0 (> 0).
            lookupd_poll_interval: Time between two lookupd queries, default 60.0 (> 0).
            lookupd_poll_jitter: Random variation of that time, in ``[0, 1)``; default 0.3.
            reconnect_min: Base of the delay before reconnecting to an nsqd, doubled with each
                failure in a row, default 0.5 (> 0).
            reconnect_max: Longest delay between reconnection attempts, default 60.0 (> 0).
            rdy_redistribute_interval: How often RDY is recomputed over the connections, default 5.0
                (> 0).
            low_rdy_idle_timeout: With fewer slots than connections, a connection holding RDY that
                received nothing for this long gives it up; default 10.0 (> 0).
            concurrency: How many handlers run at once (worker tasks, or threads for a plain ``def``
                handler: [handlers][consumer-handlers]), an int >= 1; default ``max_in_flight``,
                kept between 1 and 100.
            auto_touch: Whether to TOUCH messages whose handler is still running, from half of
                nsqd's message timeout on ([handlers][consumer-handlers]). ``None`` (default): on
                Youzan ordered partitions only, so that nsqd never hands a slow handler's message
                out again while it runs ([ordered][ordered-slow]).
            msg_timeout: How long nsqd waits for an answer to a message before delivering it again,
                sent in IDENTIFY (nsqd caps it at ``--max-msg-timeout``). Default None: nsqd's
                ``--msg-timeout`` (60 s by default).
            heartbeat_interval: How often nsqd sends a heartbeat, sent in IDENTIFY: 1 to 60, or -1
                to disable. A connection silent for two intervals (plus 10 %, at least 0.5 s) is
                closed and reconnected. Default 30.0.
            on_giving_up: Called with a message that exceeded ``max_attempts``, before it is FINed;
                may be ``async`` (then awaited in the background). Its exceptions are logged. One
                that takes two arguments also gets the reason: None, or the error the
                ``dead_letter_topic`` refused the copy with for good (the message is then finished
                without a copy). Default None: a warning is logged.
            tls: ``True`` for TLS with the system's trusted certificates and host name verification,
                an ``ssl.SSLContext`` for your own settings (client certificates, a private CA),
                ``False`` (default) for plain TCP.
            tls_hostname: Name the server certificate is checked against; default: the host of the
                nsqd address.
            snappy: Compress the connection with Snappy. Default False.
            deflate: Compress the connection with DEFLATE (not together with ``snappy``). Default
                False.
            deflate_level: DEFLATE level, 1 to 9, default 6.
            auth_secret: Secret sent with AUTH when nsqd requires authentication. Without TLS it is
                readable on the network: a warning is given once per process (see
                ``auth_over_plaintext``).
            client_id: Client id reported to nsqd (shown in its stats); default: the short host
                name.
            sample_rate: Percentage of the channel's messages nsqd delivers to this consumer, 0 to
                99; 0 (default) delivers all.
            connect_timeout: Time allowed for the TCP connection to an nsqd, default 5.0.
            ordered: Youzan ordered topics: ``True`` subscribes with ``SUB_ORDERED`` (one message in
                flight per partition, checked by offset), ``False`` never does, ``None`` (default)
                follows the topic's metadata from lookupd and what nsqd demands.
            ext: Youzan ext topics (messages with JSON headers): ``True`` negotiates
                ``extend_support``, ``False`` does not, ``None`` (default) follows the topic.
            on_order_violation: Called as ``(message, last_internal_id, last_offset)`` when a
                message of an ordered partition goes backwards (logged as an error either way). May
                be ``async``. Default None.
            on_blocked: Called with a message of an ordered partition that arrives with at least
                ``blocked_warn_attempts`` attempts (it blocks its partition); may be ``async``.
                Default None.
            blocked_warn_attempts: On ordered partitions, a message on this many attempts (and every
                multiple of it) is logged as a warning; an int >= 1, default 10.
            blocked_error_attempts: From this many attempts on, that log line is an error; an int >=
                1, default 50.
            auth_over_plaintext: ``False`` refuses to send ``auth_secret`` to an nsqd that asks for
                it over an unencrypted connection: the connection fails with
                [`InsecureAuth`][smartnsq.errors.InsecureAuth]. Default True.
            start: Where to start reading a Youzan partitioned topic (with
                ``lookupd_http_addresses``): ``None`` (default): the channel's own position;
                ``"earliest"``, ``"latest"``, a Unix time (seconds, or an aware ``datetime``) or
                ``{partition: queue offset}``. It moves the *channel* for every consumer of it, once
                per partition, before any message is read; see [where a consumer
                starts][consumer-start] for the rules and the errors raised on start.
            partitions: Partition numbers to consume (default: every partition). Needs
                ``lookupd_http_addresses``; checked on start like ``start``.
            advanced: Subscribe with ``SUB_ADVANCED`` so every message of an unordered partitioned
                topic carries ``offset`` and ``raw_size`` ([`Message`][smartnsq.Message]; ordered
                topics always do). Implied by ``start``.
            desired_tag: Receive only the messages published with this dispatch tag (Youzan ext
                topics; 1-100 ASCII letters, digits, ``_`` or ``-``). Elsewhere the consumer refuses
                to subscribe ([tags][consumer-tags]).
            output_buffer_timeout: How long nsqd may hold messages for this consumer before writing
                them out, in seconds, sent in IDENTIFY. ``None`` (default): nsqd's (250 ms); ``0``:
                no buffering, each write goes out at once (more system calls on both sides); else at
                least 0.001. nsqd allows 0.025 to 30 by default (its
                ``--min/--max-output-buffer-timeout``) and refuses others at IDENTIFY: the start
                raises [`ConfigRefused`][smartnsq.errors.ConfigRefused]. A low value gets messages
                to a consumer at a low rate sooner ([low latency][consumer-latency]).
            output_buffer_size: How many bytes nsqd may buffer for this consumer before writing,
                sent in IDENTIFY. ``None`` (default): nsqd's (16 KiB); ``0``: no buffering (nsqd
                then also ignores ``output_buffer_timeout``); else at least 64 (nsqd's
                ``--max-output-buffer-size``, 64 KiB by default, bounds it).
            dead_letter_topic: Where a message given up on (past ``max_attempts``) goes: published
                there, then finished once nsqd acknowledged the copy; requeued after a growing delay
                (without backoff) if that publish fails; given up with an ERROR if the topic refuses
                it for good ([dead letters][consumer-dead-letters]). Also on ordered partitions,
                which then move on past it. On the Youzan fork the topic must exist: else the start
                raises [`TopicNotFound`][smartnsq.errors.TopicNotFound]. ``None`` (default):
                finished.

        Raises:
            InvalidType: ``handler`` is not callable. The options are checked by
                [`start`][smartnsq.sync.Consumer.start].
        """
        if handler is not None and not callable(handler):
            raise InvalidType("handler must be a callable taking one Message (or None to iterate)")
        options = dict(locals())
        for name in ("self", "topic", "channel", "handler"):
            del options[name]
        self.topic = topic
        self.channel = channel
        self._handler = handler
        self._options = options
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = None
        self._portal: BlockingPortal | None = None
        self._consumer: AsyncConsumer | None = None
        self._entered: AbstractContextManager[Any] = nullcontext()
        # Messages, whole reads (subscription, buffer, spans), or None: stop iterating.
        self._handed: queue.SimpleQueue[Message | tuple[Any, ...] | None] = queue.SimpleQueue()
        self._current: Message | None = None
        # Messages handled in the for loop whose FIN is still to go.
        self._done: list[Message] = []
        # The rest of the read being iterated (see Sinks.set's ``reads``).
        self._read: Iterator[Message] = iter(())
        self._stopped = threading.Event()
        # A first Ctrl-C or SIGTERM in run(): stop; a second one (or one during close):
        # the stop stops waiting for running handlers.
        self._signalled = False
        self._cut = False
        self._closed = False

    @property
    def handler(self) -> Handler | None:
        """The handler (set it only before the consumer starts, say to wrap it)."""
        return self._handler

    @handler.setter
    def handler(self, handler: Handler) -> None:
        if self.started:
            raise NSQError("change a Consumer's handler before starting it")
        self._handler = handler

    @property
    def started(self) -> bool:
        """Whether the consumer was started (or closed): a Consumer starts only once. Code
        that wraps the handler (``smartnsq.observe.otel``) checks it."""
        return self._portal is not None or self._closed

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> Consumer:
        self.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(handled=exc_type is None)

    def start(self) -> None:
        """Start consuming (``with`` does this).

        Raises:
            InvalidArgument: A bad option (see [`smartnsq.Consumer`][smartnsq.Consumer]),
                raised here before any connection is made.
            InvalidType: An option of the wrong type.
            ConfigRefused: An nsqd refused the settings (see
                [`smartnsq.Consumer`][smartnsq.Consumer]: its start).
            NSQError: The consumer was already started.
        """
        if self.started:
            raise NSQError("a sync Consumer can be started only once")
        self._portal_cm = start_blocking_portal()
        self._portal = portal = self._portal_cm.__enter__()
        try:
            self._consumer = portal.call(self._create)
            # Entered and exited in one task of the loop (it owns a task group).
            self._entered = portal.wrap_async_context_manager(self._consumer)
            self._entered.__enter__()
        except BaseException:
            self._portal_cm.__exit__(None, None, None)
            self._portal = None
            raise

    def _create(self) -> AsyncConsumer:
        consumer = AsyncConsumer(self.topic, self.channel, self._handler, **self._options)
        if self._handler is None:
            put = self._handed.put  # on the loop; a thread-safe put
            consumer.sinks.set(put, lambda *read: put(read))
        return consumer

    def close(self, timeout: float = 10.0, *, handled: bool = True) -> None:
        """Stop gracefully (see [`smartnsq.Consumer.stop`][smartnsq.Consumer.stop]).

        Messages handed over but not yet taken by the loop are requeued at once. ``with``
        calls it on exit, with ``handled=False`` when an exception leaves the block.

        Args:
            timeout: Seconds running handlers get to finish, default 10.0.
            handled: Whether the message being handled in the ``for`` loop counts as done
                (FIN, the default) or not (requeued).
        """
        if self._closed or self._portal is None or self._consumer is None:
            self._closed = True
            return
        self._closed = True
        portal, consumer = self._portal, self._consumer
        self._settle_done()
        current, self._current = self._current, None
        if current is not None:
            consumer.sinks.settle(current, "finish" if handled else "requeue")
        stop = portal.start_task_soon(consumer.stop, timeout)
        # Ctrl-C while waiting would raise KeyboardInterrupt out of the wait and leave the
        # stop (and nsqd's in-flight messages) behind: it cuts the wait instead.
        guarded = _main_thread() and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        previous = signal.signal(signal.SIGINT, self._on_signal) if guarded else None
        try:
            cut = False
            # Messages waiting for this thread go back at once; more may arrive until RDY 0.
            while not stop.done():
                self._give_back_waiting()
                if self._cut and not cut:
                    cut = True
                    portal.start_task_soon(consumer.stop, 0)  # a second stop cuts the first
                try:
                    stop.result(timeout=0.05)
                except TimeoutError:
                    continue
            self._give_back_waiting()
            try:
                self._entered.__exit__(None, None, None)
            finally:
                self._stopped.set()
                assert self._portal_cm is not None
                self._portal_cm.__exit__(None, None, None)
        finally:
            if guarded:
                signal.signal(signal.SIGINT, previous)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Flags and a SimpleQueue put only: the code this interrupts may hold a lock (an
        # Event's) that this thread would wait for for ever.
        name = signal.Signals(signum).name
        if not self._closed and not self._signalled:  # not stopping yet
            log.info("%s received: stopping (send it again to stop at once)", name)
            self._signalled = True
            self._handed.put(None)  # wakes run()
        elif not self._cut:
            log.warning("%s received while stopping: cancelling running handlers", name)
            self._cut = True

    def stop(self) -> None:
        """Ask [`run`][smartnsq.sync.Consumer.run] (or an iteration) to end.

        Callable from any thread, a handler included; the graceful stop follows in the thread
        that runs or iterates.
        """
        self._stopped.set()
        self._handed.put(None)

    def run(self, *, stop_timeout: float = 10.0) -> None:
        """With a handler: consume until [`stop`][smartnsq.sync.Consumer.stop], Ctrl-C or
        SIGTERM, then stop gracefully and return.

        Handlers run in worker threads (see [`smartnsq.Consumer`][smartnsq.Consumer]). The
        stop is [`smartnsq.run`][smartnsq.run]'s: running handlers get up to
        ``stop_timeout`` seconds, and a second Ctrl-C or SIGTERM cuts that wait (their
        messages are requeued). Signals are caught only when called in the main thread.

        Args:
            stop_timeout: Seconds running handlers get to finish once the stop begins
                (>= 0), default 10.0.

        Raises:
            NSQError: The consumer has no handler.
            InvalidArgument: A negative or infinite ``stop_timeout``.
        """
        if self._handler is None:
            raise NSQError("run() needs a handler; iterate over a handler-less Consumer")
        check_number("stop_timeout", stop_timeout, min=0)
        previous: dict[signal.Signals, Any] = {}
        if _main_thread():
            previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_signal)
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_signal)
        try:
            self.start()
            try:
                self._handed.get()  # None: stop() or a signal (a handler gets no reads)
            finally:
                self.close(stop_timeout)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    # -- iterating -------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Message]:
        if self._handler is not None:
            raise NSQError("this Consumer has a handler; call run(), or iterate without one")
        if self._portal is None or self._consumer is None:
            raise NSQError("start the Consumer first: 'with Consumer(...) as c: for m in c'")
        handed = self._handed
        make = self._consumer.sinks.messages
        taken = since = 0.0  # when the loop body got the current / oldest unfinished one
        try:
            while not self._stopped.is_set():
                current, self._current = self._current, None
                if current is not None:
                    if not self._done:
                        since = taken
                    self._done.append(current)
                message = next(self._read, None)
                if message is None:
                    try:
                        item = handed.get_nowait()
                    except queue.Empty:
                        self._settle_done()  # before sleeping: nothing waits on this thread
                        item = handed.get()
                    if item is None:
                        return
                    if isinstance(item, tuple):  # a whole read: its messages are made here
                        self._read = make(*item)
                        continue
                    message = item
                taken = time.monotonic()
                if self._done and taken - since >= SETTLE_AFTER:
                    self._settle_done()
                self._current = message
                yield message
        finally:
            self._settle_done()

    def stats(self) -> ConsumerStats:
        """The consumer's counters (see [`smartnsq.Consumer.stats`][smartnsq.Consumer.stats]).

        Returns:
            A [`ConsumerStats`][smartnsq.ConsumerStats] snapshot.

        Raises:
            NSQError: The consumer is not started.
        """
        if self._consumer is None:
            raise NSQError("the Consumer is not started")
        return self._consumer.stats()

    def lag(
        self, *, nsqd_http_addresses: Sequence[str] = (), timeout: float = 10.0
    ) -> list[ChannelLag]:
        """How many messages this channel has not consumed yet (see
        [`smartnsq.Consumer.lag`][smartnsq.Consumer.lag]); it may be called before
        [`start`][smartnsq.sync.Consumer.start] and from any thread that is not running an
        event loop.

        Args:
            nsqd_http_addresses: nsqd HTTP addresses to ask; needed without a lookupd.
            timeout: Seconds for the whole call.

        Returns:
            One [`ChannelLag`][smartnsq.lag.ChannelLag] per nsqd or partition.

        Raises:
            InvalidArgument: No lookupd and no ``nsqd_http_addresses`` to ask.
            LookupFailed: No lookupd answered.
            NsqdHttpFailed: No nsqd answered.
        """
        lookupds = self._options.get("lookupd_http_addresses", ())
        lag: list[ChannelLag] = anyio.run(
            consumer_lag, self.topic, self.channel, lookupds, nsqd_http_addresses, timeout
        )
        return lag

    # -- the loop's side -------------------------------------------------------------------------

    def _settle_done(self) -> None:
        # A burst's FINs go to the loop in one hand-over, when this thread would sleep: one
        # per message woke the loop thread mid-burst to fight this one for the GIL, which
        # cost 12-22 % more CPU and delayed the burst's later messages.
        done = self._done
        if done:
            self._done = []
            assert self._consumer is not None
            self._consumer.sinks.settle_all(done, "finish")

    def _give_back_waiting(self) -> None:
        assert self._consumer is not None
        sinks = self._consumer.sinks
        back = list(self._read)
        self._read = iter(())
        while True:
            try:
                handed = self._handed.get_nowait()
            except queue.Empty:
                break
            if isinstance(handed, tuple):
                back += sinks.messages(*handed)
            elif handed is not None:
                back.append(handed)
        if back:
            sinks.settle_all(back, "back")


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
