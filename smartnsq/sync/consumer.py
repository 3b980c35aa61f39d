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
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from types import FrameType
from typing import Any

import anyio
from anyio.from_thread import BlockingPortal, start_blocking_portal

from smartnsq._checks import check_number
from smartnsq.consumer import Consumer as AsyncConsumer
from smartnsq.consumer import Handler
from smartnsq.errors import InvalidType, NSQError
from smartnsq.lag import ChannelLag, consumer_lag
from smartnsq.message import Message
from smartnsq.observe.stats import ConsumerStats

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
        self, topic: str, channel: str, handler: Handler | None = None, **options: Any
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
            **options: Any keyword argument of [`smartnsq.Consumer`][smartnsq.Consumer]
                (``lookupd_http_addresses``, ``nsqd_tcp_addresses``, ``max_in_flight``, ...).

        Raises:
            InvalidType: ``handler`` is not callable. The options are checked by
                [`start`][smartnsq.sync.Consumer.start].
        """
        if handler is not None and not callable(handler):
            raise InvalidType("handler must be a callable taking one Message (or None to iterate)")
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
