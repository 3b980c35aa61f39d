"""The consuming front door, :class:`Consumer`: it checks the options, wires the parts
(nodes, intake, workers, threads, answers, pacing, drain: one module each) and starts them."""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from functools import partial
from typing import Any

import anyio
import anyio.abc

from smartnsq._checks import FORKS, check_number, get_ident, owner, wrong_owner
from smartnsq.consumer.answers import Answers
from smartnsq.consumer.deadletters import DeadLetterTopic
from smartnsq.consumer.drain import Drain
from smartnsq.consumer.intake import Intake
from smartnsq.consumer.message import Message
from smartnsq.consumer.nodes import Nodes
from smartnsq.consumer.options import GivingUp, Handler, Options, is_async_handler
from smartnsq.consumer.pacing import Pacing
from smartnsq.consumer.sinks import Sinks
from smartnsq.consumer.state import State
from smartnsq.consumer.threads import Threads
from smartnsq.consumer.workers import Workers
from smartnsq.errors import ConfigRefused, NSQError, ServerError
from smartnsq.lag import ChannelLag, consumer_lag
from smartnsq.net.connection import ConnectionConfig
from smartnsq.protocol.offsets import Start
from smartnsq.stats import ConsumerStats, consumer_stats
from smartnsq.trace import TraceSwitch


class Consumer:
    """Consumes a channel of a topic from one or more nsqd.

        async def handle(message: Message) -> None:
            ...  # return: FIN; return False or raise: REQ with backoff

        async with Consumer("events", "archive", handle, lookupd_http_addresses=[...]) as c:
            await anyio.sleep_forever()

    The handler's answer works as in pynsq: ``False`` or raising REQs the message (with the
    delay policy, and backoff), anything else FINs it (see ``handler`` below). A plain ``def``
    handler runs in worker threads, so one that blocks does not stop the event loop from
    answering nsqd's heartbeats; [`Message.finish`][smartnsq.Message.finish] and friends may
    be called from those threads.

    One nsqd or nsqlookupd that fails, in whatever way, is logged, retried with backoff and
    does not stop consumption from the others. Settings nsqd refuses are not a failure to
    retry: the start (``async with``, [`run`][smartnsq.Consumer.run]) waits until nsqd
    accepts them (a subscription) or every nsqd known failed once (at most
    ``connect_timeout`` plus the handshake's 5 s), and raises
    [`ConfigRefused`][smartnsq.errors.ConfigRefused] if one refused them.

    Or pull messages without a handler:

        async with Consumer("events", "archive", nsqd_tcp_addresses=[...]) as consumer:
            async for message in consumer:
                ...  # finished automatically when the next one is pulled

    Bodies a Youzan producer compressed itself are handed over decompressed (see
    [compressed bodies][consumer-compressed-bodies]).

    A Consumer can be started once, and belongs to the event loop (thread) and process that
    started it: used from another thread it raises
    [`WrongEventLoop`][smartnsq.errors.WrongEventLoop], in a child after ``fork()``
    [`UsedAfterFork`][smartnsq.errors.UsedAfterFork].

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
        """Configure a consumer; nothing connects until it is started.

        Start it with ``async with``, [`run`][smartnsq.Consumer.run] or
        [`smartnsq.run`][smartnsq.run]. Every argument is checked here: a wrong type raises
        [`InvalidType`][smartnsq.errors.InvalidType], a value out of range
        [`InvalidArgument`][smartnsq.errors.InvalidArgument]. Times are in seconds.

        Args:
            topic: The topic to consume (NSQ's naming rules: 1-64 characters of ``[.a-zA-Z0-9_-]``,
                optionally ending in ``#ephemeral``).
            channel: The channel to subscribe to (the same rules as ``topic``). Consumers on one
                channel share its messages; each channel gets every message.
            handler: Called with each [`Message`][smartnsq.Message]. An ``async def`` handler runs
                on the event loop, ``concurrency`` at a time; a plain ``def`` handler runs in a pool
                of up to ``concurrency`` worker threads. Returning ``None``, ``True`` or anything
                but ``False`` FINs the message; returning ``False`` or raising REQs it (the
                exception is logged with its traceback) and counts as a failure for backoff. An
                awaitable it returns is awaited first. ``None`` (the default): no handler; iterate
                with ``async for message in consumer``.
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
            InvalidArgument: A value is out of range, a name breaks NSQ's rules, or neither
                ``nsqd_tcp_addresses`` nor ``lookupd_http_addresses`` was given.
            InvalidType: A value has the wrong type.
        """
        arguments = dict(locals())
        del arguments["self"]
        self._options = options = Options(**arguments)
        self.topic = options.topic
        self.channel = options.channel
        self._state = state = State(options)
        self._pacing = pacing = Pacing(state)
        self._answers = answers = Answers(state, pacing)
        if options.dead_letter_topic is not None:
            answers.dead = DeadLetterTopic(state, options.dead_letter_topic)
        self._threads = threads = Threads(state, answers)
        self._workers = workers = Workers(state, answers)
        self._intake = intake = Intake(state, answers, workers, threads)
        self._nodes = nodes = Nodes(state, answers, pacing, intake)
        self._drain = Drain(state, answers, workers, threads, intake, nodes)
        self._sinks = Sinks(intake, answers, options)
        self._started = False

    @property
    def handler(self) -> Handler | None:
        """The handler (set it only before the consumer starts, say to wrap it)."""
        return self._options.handler

    @handler.setter
    def handler(self, handler: Handler) -> None:
        if self._started:
            raise NSQError("change a Consumer's handler before starting it")
        self._options.handler = handler
        self._options.async_handler = is_async_handler(handler)

    @property
    def started(self) -> bool:
        """Whether the consumer was started; it stays True once stopped (a Consumer starts
        only once). Code that wraps the handler (``smartnsq.observe.otel``) checks it."""
        return self._started

    @property
    def sinks(self) -> Sinks:
        """Where deliveries can go instead of a handler (for front doors built on this
        consumer): see ``smartnsq.consumer.Sinks``."""
        return self._sinks

    @property
    def trace(self) -> TraceSwitch:
        """Run-time trace switch ([`TraceSwitch`][smartnsq.trace.TraceSwitch]): while tracing
        is on for the topic, each message received is written as a ``consume`` record."""
        return self._intake.trace

    @property
    def last_error(self) -> ServerError | None:
        """The last error an nsqd refused the connection or subscription with (say an
        IDENTIFY setting outside its limits, or an ordered topic with ``ordered=False``), or
        None."""
        return self._nodes.last_error

    @property
    def connection_config(self) -> ConnectionConfig:
        """The settings (TLS, AUTH, timeouts, IDENTIFY) each connection to nsqd gets."""
        return self._options.config

    # -- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> Consumer:
        """Start consuming; ``async with`` calls it.

        It returns once nsqd is known to accept the settings (a subscription worked), or every
        nsqd known failed once for a reason that reconnecting can fix (they are retried in
        the background), waiting at most ``connect_timeout`` plus the handshake's timeout.

        Raises:
            ConfigRefused: An nsqd refused the settings (IDENTIFY's ``E_BAD_BODY`` for an
                ``output_buffer_timeout`` outside its limits, a refused or missing AUTH, TLS
                it requires): reconnecting cannot help. Nothing was consumed.
            NSQError: The consumer was already started.
        """
        await self._begin()
        self._state.tg = tg = anyio.create_task_group()
        await tg.__aenter__()
        self._start_tasks()
        try:
            await self._nodes.first_answers(self._start_wait())
        except ConfigRefused:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        try:
            # A pulled message whose loop body ended normally (say, by 'break') was handled.
            await self._drain.stop(10.0, pulled_done=exc_type is None)
        finally:
            tg = self._state.tg
            assert tg is not None
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)

    async def run(self) -> None:
        """Start consuming and block until [`stop`][smartnsq.Consumer.stop] is called.

        Call ``stop`` from another task (or a handler), or run the consumer with
        [`smartnsq.run`][smartnsq.run], which stops it on SIGINT or SIGTERM.

        Raises:
            NSQError: The consumer was already started.
            ConfigRefused: An nsqd refused the settings at the start (see
                ``async with``).
        """
        await self._begin()
        refused: ConfigRefused | None = None
        async with anyio.create_task_group() as tg:
            self._state.tg = tg
            self._start_tasks()
            try:
                await self._nodes.first_answers(self._start_wait())
            except ConfigRefused as exc:  # raised below: not as a task group's error
                refused = exc
                await self._drain.stop(0.0, pulled_done=True)
            else:
                await self._drain.stopped.wait()
            tg.cancel_scope.cancel()
        if refused is not None:
            raise refused

    def _start_wait(self) -> float:
        """How long a start waits to learn whether nsqd accepts the settings: a connection
        and its handshake."""
        config = self._options.config
        return config.connect_timeout + config.handshake_timeout

    async def wait_stopped(self) -> None:
        """Wait until the consumer has stopped (a [`stop`][smartnsq.Consumer.stop] is over)."""
        await self._drain.stopped.wait()

    async def _begin(self) -> None:
        if self._started:
            raise NSQError("a Consumer can be started only once")
        await self._options.start_plan.check()
        if self._answers.dead is not None:
            await self._answers.dead.check()
        self._started = True
        self._state.thread, self._state.forks = owner()

    def _start_tasks(self) -> None:
        # With an async handler the workers' task also runs what the inbox carries over from
        # other threads: one task less per consumer.
        self._threads.start(self._workers.soon if self._options.async_handler else None)
        self._nodes.start()
        if self._answers.dead is not None:
            self._state.spawn(self._dead_letters)
        if self._options.auto_touch:
            self._state.spawn(self._drain.touch_loop)
        elif self._options.auto_touch is None:  # once an ordered partition is subscribed
            self._intake.start_touching = partial(self._state.spawn, self._drain.touch_loop)
        if self._options.async_handler:
            self._state.spawn(self._workers.run)

    async def _dead_letters(self) -> None:
        dead = self._answers.dead
        assert dead is not None
        try:
            await dead.run()
        except ConfigRefused as exc:
            # Its producer has the consumer's settings: the consumer's own start raises the
            # same refusal (this task must not end the task group before it can).
            logging.getLogger("smartnsq.consumer").error("dead-letter producer: %s", exc)

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop gracefully; nothing is left in flight.

        RDY 0 everywhere; messages not yet handed to the handler are requeued (one pulled
        with ``async for`` counts as handled and is finished); running handlers get up to
        ``timeout`` seconds, then are cancelled and their messages requeued; then CLS, and a
        message that still comes is requeued ([Graceful shutdown][graceful-shutdown] has
        each step).

        Called again while a stop is under way, it waits for that stop, cutting its wait for
        running handlers down to ``timeout`` if that is sooner (say, on a second Ctrl-C).

        Args:
            timeout: Seconds running handlers get to finish (>= 0), default 10.0.

        Raises:
            WrongEventLoop: Called from another thread than the one running the consumer.
            UsedAfterFork: Called in a child process after ``fork()``.
        """
        self._check_owner()
        check_number("timeout", timeout, min=0)
        self._drain.cut(timeout)
        await self._drain.stop(timeout, pulled_done=True)

    def _check_owner(self) -> None:
        state = self._state
        if state.thread != get_ident() or state.forks != FORKS[0]:
            wrong_owner("Consumer", state.thread, state.forks)

    # -- public state ----------------------------------------------------------------------------

    @property
    def max_in_flight(self) -> int:
        """The current ``max_in_flight``.

        Change it with [`set_max_in_flight`][smartnsq.Consumer.set_max_in_flight].
        """
        return self._state.max_in_flight

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
        self._check_owner()
        check_number("max_in_flight", value, integer=True, min=0)
        self._state.max_in_flight = value
        self._pacing.redistribute()

    def is_starved(self) -> bool:
        """Whether some connection has used 85 % or more of its RDY on unanswered messages.

        A handler that batches messages (``message.disable_auto_response()`` and answers
        later) should process what it holds when this is True: nsqd sends nothing more on a
        connection whose RDY is used up.

        Returns:
            True when some connection with RDY > 0 has at least 85 % of it in flight.
        """
        return any(s.rdy and s.in_flight >= 0.85 * s.rdy for s in self._state.subs.values())

    def stats(self) -> ConsumerStats:
        """Counters since the start, and each subscribed connection's RDY and in-flight.

        Returns:
            A [`ConsumerStats`][smartnsq.ConsumerStats] snapshot (``nodes``: per connection).
        """
        a, state = self._answers, self._state
        counts = state.received, a.finished, a.requeued, a.discarded, self._pacing.backoff.level
        return consumer_stats(*counts, list(state.subs.values()), a.refused)

    async def lag(
        self, *, nsqd_http_addresses: Sequence[str] = (), timeout: float = 10.0
    ) -> list[ChannelLag]:
        """Messages this channel has not consumed yet, per nsqd (classic) or partition
        (Youzan), as nsqd tells it now (see [`channel_lag`][smartnsq.lag.channel_lag]).

        Args:
            nsqd_http_addresses: nsqd HTTP addresses to ask; needed without a lookupd (a TCP
                connection does not tell nsqd's HTTP port).
            timeout: Seconds for the whole call.

        Returns:
            One [`ChannelLag`][smartnsq.lag.ChannelLag] per nsqd or partition.

        Raises:
            InvalidArgument: No lookupd and no ``nsqd_http_addresses`` to ask.
            LookupFailed: No lookupd answered.
            NsqdHttpFailed: No nsqd answered.
        """
        options = self._options
        return await consumer_lag(
            options.topic, options.channel, options.lookupds, nsqd_http_addresses, timeout
        )

    # -- pulling ---------------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[Message]:
        self._check_owner()
        if self._options.handler is not None:
            raise NSQError("this Consumer has a handler; iterate only over a handler-less one")
        if not self._started:
            raise NSQError("start the Consumer first: 'async with Consumer(...) as c: async for'")
        return self

    async def __anext__(self) -> Message:
        self._check_owner()
        return await self._workers.pull()
