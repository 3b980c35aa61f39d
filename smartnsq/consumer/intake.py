"""Intake: a subscription's reads, turned into deliveries for whoever takes them."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from functools import partial

from smartnsq.consumer.answers import Answers
from smartnsq.consumer.message import Message, delivered, delivered_ordered, delivered_read, id_text
from smartnsq.consumer.state import State
from smartnsq.consumer.subscription import Subscription
from smartnsq.consumer.threads import Threads
from smartnsq.consumer.workers import Workers
from smartnsq.errors import ConnectionClosed
from smartnsq.net.connection import Connection
from smartnsq.ordered.validation import OrderChecker
from smartnsq.protocol import commands
from smartnsq.protocol.compress import maybe_compressed, unpack
from smartnsq.protocol.frames import Span
from smartnsq.protocol.message import CLASSIC, HEAD_SIZE, ID_AT, check_spans, unpack_head
from smartnsq.trace import TraceSwitch, emit

log = logging.getLogger("smartnsq.consumer")

#: Takes a subscription's read as it came: the read buffer and its message frames' spans,
#: each frame's data being ``[timestamp][attempts][id][body]``.
RawSink = Callable[[Subscription, bytes, list[Span]], None]
#: Takes each delivered message (on the loop).
Sink = Callable[[Message], None]
#: Takes a subscription's read whole for a message sink's owner, who makes its messages
#: with :meth:`Intake.messages`: ``(subscription, read buffer, message frames' spans)``.
ReadSink = Callable[[Subscription, bytes, list[Span]], None]


class Intake:
    """Turns each read of a subscription into deliveries.

    A read's message frames go to one sink: the handler threads (whole reads), a raw sink
    (whole reads, see :meth:`set_raw_sink`), a message sink (see :meth:`set_sink`; whole
    reads too, when it has a read sink), or the workers' queue (an ``async def`` handler,
    or pulling). An ordered subscription's reads (one partition) with an async handler take
    the shortest way (:meth:`on_ordered`). Messages are made by the delivery module only
    (:func:`~smartnsq.consumer.message.delivered`,
    :func:`~smartnsq.consumer.message.delivered_read`); the counters are settled once per
    read, in :meth:`took`.
    """

    __slots__ = (
        "answers",
        "order",
        "raw_sink",
        "read_sink",
        "sink",
        "start_touching",
        "state",
        "threads",
        "trace",
        "workers",
    )

    def __init__(self, state: State, answers: Answers, workers: Workers, threads: Threads) -> None:
        self.state = state
        self.answers = answers
        self.workers = workers
        self.threads = threads
        self.trace = TraceSwitch()
        self.order: dict[int | None, OrderChecker] = {}
        self.raw_sink: RawSink | None = None
        self.sink: Sink | None = None
        self.read_sink: ReadSink | None = None
        # Starts the touch loop when the first ordered partition is subscribed (auto_touch None).
        self.start_touching: Callable[[], object] | None = None

    def set_raw_sink(self, sink: RawSink) -> None:
        """See :meth:`smartnsq.consumer.Sinks.set_raw`."""
        self.raw_sink = sink

    def set_sink(self, sink: Sink, reads: ReadSink | None = None) -> None:
        """See :meth:`smartnsq.consumer.Sinks.set`."""
        self.sink = sink
        self.read_sink = reads

    def messages(self, sub: Subscription, src: bytes, spans: list[Span]) -> Iterator[Message]:
        """The messages of a read handed to a read sink, made one at a time as they are
        taken (any thread); one past ``max_attempts`` is given up (on the loop) instead."""
        max_attempts = self.state.options.max_attempts
        answers = self.answers
        for _, start, end in spans:
            msg = delivered(sub, src, start, end)
            if max_attempts and msg.attempts > max_attempts:
                answers.give_up_anywhere(msg)
            else:
                yield msg

    def attach(self, sub: Subscription, conn: Connection) -> None:
        """Route the message frames of ``sub``'s reads (on ``conn``, its connection) here."""
        options = self.state.options
        if sub.straight and options.async_handler:
            conn.on_messages = partial(self.on_ordered, sub)
            conn.before_read = None  # it reads the clock itself: one call fewer per message
        else:
            conn.on_messages = partial(self.on_messages, sub)
            conn.before_read = sub.before_read
        if sub.ordered and self.start_touching is not None:
            start, self.start_touching = self.start_touching, None
            start()

    def repeats(self, sub: Subscription, src: bytes, spans: list[Span]) -> list[Span]:
        """An ordered subscription's message frames less repeats of the message last handed on.

        nsqd sends that message again when its timeout passes while the handler still runs
        (or after a reset of the channel's position): the copy is not handed on, so that
        one handler at a time runs per partition; the answer to the first, still to come,
        answers the copy too (same id). A copy with the same attempts that comes after the
        answer is the same delivery sent twice: finished again, not handled again. A
        redelivery after a requeue has more attempts and is handled.
        """
        fresh = []
        for span in spans:
            _, start, end = span
            if end - start < HEAD_SIZE:  # the decoding that follows raises ProtocolError
                fresh.append(span)
                continue
            mid = src[start + ID_AT : start + HEAD_SIZE]
            attempts = unpack_head(src, start)[1]
            if mid == sub.last_id:
                if sub.in_flight:
                    log.debug(
                        "%s: message %s delivered again while handled", sub.address, mid.hex()
                    )
                    continue
                if attempts == sub.last_attempts:
                    log.debug(
                        "%s: message %s delivered twice; finished again", sub.address, mid.hex()
                    )
                    with contextlib.suppress(ConnectionClosed):
                        sub.write(commands.fin(mid))
                    continue
            sub.last_id = mid
            sub.last_attempts = attempts
            fresh.append(span)
        return fresh

    def on_messages(self, sub: Subscription, src: bytes, spans: list[Span]) -> None:
        """Every message frame of one read."""
        if sub.ordered:
            spans = self.repeats(sub, src, spans)
            if not spans:
                return
        state = self.state
        options = state.options
        self.took(sub, len(spans), sub.batch_time)
        # Top up before it runs dry (not an ordered RDY 1: nsqd keeps it, as a window).
        if (
            sub.rdy
            and sub.rdy_left <= sub.rdy >> 2
            and not self.answers.pacing.backoff.level
            and not sub.ordered
        ):
            sub.set_rdy(sub.rdy)
        if sub.layout is CLASSIC and not (
            state.stopping or options.auto_touch or self.trace.active
        ):
            # The whole read to whoever takes reads as they are: the raw sink, a read sink or
            # the sync handler's threads; the last two make the messages on their own thread,
            # which then need not wait for the loop to make a whole read's worth.
            pool = self.threads.pool
            whole = self.raw_sink or self.read_sink
            if whole is None and pool is not None:
                whole = pool.submit
            if whole is not None:
                check_spans(spans)
                whole(sub, src, spans)
                return
            # Hot path: classic frames straight to the workers' queue (or the sink).
            queue = self.workers.queue
            append = self.sink or queue.append
            max_attempts = options.max_attempts
            for msg in delivered_read(sub, src, spans):
                if max_attempts and msg.attempts > max_attempts:
                    self.answers.give_up(msg)
                else:
                    append(msg)
            if queue:
                self.workers.wake()
            return
        batch = []
        now = sub.batch_time
        for _, start, end in spans:
            msg = delivered(sub, src, start, end, now)
            if self.on_message(sub, msg):
                batch.append(msg)
        if batch:
            assert self.threads.pool is not None
            self.threads.pool.submit(sub, None, batch)

    def on_ordered(self, sub: Subscription, src: bytes, spans: list[Span]) -> None:
        """``on_messages`` for an ordered subscription's plain messages with an async handler
        (nothing to skip, trace or decompress): decoded in place, the order checked inline,
        and handled now. An ordered subscription is round-trip bound: every step counts."""
        sub.batch_time = now = time.monotonic()
        state = self.state
        if state.stopping or self.trace.active or sub.skip is not None:
            self.on_messages(sub, src, spans)
            return
        spans = self.repeats(sub, src, spans)
        if not spans:
            return
        self.took(sub, len(spans), now)  # an ordered RDY is never topped up
        checker = self.order.get(sub.partition)
        if checker is None:
            checker = self.order[sub.partition] = OrderChecker()
        warn_at = state.options.blocked_warn_attempts
        # Past max_attempts an ordered message is skipped only for a dead letter (see on_message).
        give_up_after = state.options.max_attempts if self.answers.dead is not None else 0
        workers = self.workers
        idle = workers.idle
        for _, start, end in spans:
            msg, internal_id = delivered_ordered(sub, src, start, end, now)
            offset: int = msg.offset  # type: ignore[assignment]  # never None here
            attempts = msg.attempts
            sub.held = msg
            if internal_id < checker.last_id or offset < checker.last_offset or attempts >= warn_at:
                self.check_order(sub, msg)  # logs and callbacks
            else:
                checker.last_id = internal_id
                checker.last_offset = offset
            if state.stopping:  # a handler of this read stopped the consumer
                self.answers.give_back(msg)
            elif give_up_after and attempts > give_up_after:
                self.answers.give_up(msg)
            elif not idle.run_as_worker(workers.handle_now, msg):
                workers.queue.append(msg)
                workers.wake(eager=True)

    def took(self, sub: Subscription, n: int, now: float) -> None:
        """``n`` messages of one read arrived at ``now``: the one place intake counts them."""
        sub.took(n, now)
        self.state.received += n

    def on_message(self, sub: Subscription, msg: Message) -> bool:
        """Account for one message made by :func:`delivered`; True when it is for the
        handler threads."""
        state = self.state
        options = state.options
        answers = self.answers
        if sub.ordered:
            sub.held = msg
        skip = sub.skip
        if skip is not None:
            stale, sub.skip = skip.check(msg.offset, msg.timestamp, msg.attempts)
            if stale:
                answers.fin(msg, count=False)  # from before the start, or it comes again
                return False
        if sub.ordered:
            self.check_order(sub, msg)
        if self.trace.active and self.trace.enabled(options.topic):
            self._trace(sub, msg)
        if state.stopping:
            answers.give_back(msg)
            return False
        # On an ordered partition skipping a message breaks the order: only for a dead letter.
        if (
            options.max_attempts
            and msg.attempts > options.max_attempts
            and (not sub.ordered or answers.dead is not None)
        ):
            answers.give_up(msg)
            return False
        if msg.ext is not None and maybe_compressed(msg.ext) and (failed := unpack(msg)):
            answers.handler_failed(msg, failed)  # as if the handler had raised it
            return False
        if self.threads.pool is not None:
            return True
        workers = self.workers
        # Ordered: the partition waits for this very answer, so an idle worker's handling
        # runs now, here (or, failing that, the woken worker runs before this returns).
        if (
            sub.ordered
            and options.handler is not None
            and workers.idle.run_as_worker(workers.handle_now, msg)
        ):
            return False
        if self.sink is not None:
            self.sink(msg)
            return False
        workers.queue.append(msg)
        workers.wake(eager=sub.ordered)
        return False

    def check_order(self, sub: Subscription, msg: Message) -> None:
        options = self.state.options
        partition = msg.partition if sub.partition is None else sub.partition
        checker = self.order.get(partition)
        if checker is None:
            checker = self.order[partition] = OrderChecker()
        last_id, last_offset = checker.last_id, checker.last_offset
        if not checker.check(msg.internal_id, msg.offset):
            log.error(
                "order violation on %s partition %s: internal id %d / offset %s after %d / %d",
                options.topic,
                partition,
                msg.internal_id,
                msg.offset,
                last_id,
                last_offset,
            )
            if options.on_order_violation is not None:
                self.state.call_back(
                    "on_order_violation", options.on_order_violation, msg, last_id, last_offset
                )
        attempts = msg.attempts
        warn, error = options.blocked_warn_attempts, options.blocked_error_attempts
        if attempts >= warn:
            level = logging.ERROR if attempts >= error else logging.WARNING
            if attempts in (warn, error) or attempts % warn == 0:
                log.log(
                    level,
                    "ordered partition %s of %s is blocked: message %s is on attempt %d",
                    partition,
                    options.topic,
                    id_text(msg),
                    attempts,
                )
            if options.on_blocked is not None:
                self.state.call_back("on_blocked", options.on_blocked, msg)

    def _trace(self, sub: Subscription, msg: Message) -> None:
        youzan = sub.layout.binary_id
        options = self.state.options
        emit(
            "consume",
            topic=options.topic,
            channel=options.channel,
            partition=msg.partition,
            internal_id=msg.internal_id if youzan else None,
            trace_id=msg.trace_id if youzan else None,
            message_id=msg.id.hex(),
            offset=msg.offset,
            size=msg.raw_size,
            attempts=msg.attempts,
            local=sub.conn.local_address,
            nsqd=sub.address,
        )
