"""Sinks: where a consumer's deliveries can go instead of a handler or ``async for``.

For front doors built on the async :class:`~smartnsq.Consumer`: the blocking
:class:`smartnsq.sync.Consumer` takes every message through a message sink; smartnsq.spark's
feed takes classic reads whole through a raw sink. Reach them as ``consumer.sinks``.
"""

from __future__ import annotations

from collections.abc import Iterator

from smartnsq.consumer.answers import Answers, Outcome
from smartnsq.consumer.intake import Intake, RawSink, ReadSink, Sink
from smartnsq.consumer.message import Message
from smartnsq.consumer.options import Options
from smartnsq.consumer.subscription import Subscription
from smartnsq.errors import NSQError
from smartnsq.protocol.frames import Span


class Sinks:
    """A consumer's sinks; set them before the consumer starts."""

    __slots__ = ("_answers", "_intake", "_options")

    def __init__(self, intake: Intake, answers: Answers, options: Options) -> None:
        self._intake = intake
        self._answers = answers
        self._options = options

    def set(self, sink: Sink, reads: ReadSink | None = None) -> None:
        """Hand each message to ``sink(message)`` on the event loop (a consumer without a
        handler, instead of ``async for``). The sink's owner answers every message, from any
        thread, with ``settle`` or the message's own methods;
        a graceful stop waits for that (up to its timeout).

        Args:
            sink: Called on the loop with each message; it must not block.
            reads: If given, called on the loop instead of ``sink`` with each classic read
                whole, as ``reads(subscription, buffer, spans)``; its owner makes the
                read's messages with [`messages`][smartnsq.consumer.Sinks.messages] on its
                own thread, and answers them as ``sink``'s. The loop then makes none: an
                owner on another thread gets a read's first message without waiting for
                the loop to make the rest. It must not block either.

        Raises:
            NSQError: The consumer has a handler.
        """
        if self._options.handler is not None:
            raise NSQError("a message sink is for a Consumer without a handler")
        self._intake.set_sink(sink, reads)

    def messages(self, sub: Subscription, src: bytes, spans: list[Span]) -> Iterator[Message]:
        """The messages of a read given to a ``reads`` sink, made one at a time as they are
        taken (any thread). A message past ``max_attempts`` is given up (on the loop) and
        not yielded. Messages not taken stay in flight: give them back with ``settle``.

        Args:
            sub: The read's subscription, as given to the sink.
            src: The read's buffer.
            spans: Its message frames' spans.

        Yields:
            Each message of the read, in order.
        """
        return self._intake.messages(sub, src, spans)

    def settle(self, message: Message, outcome: Outcome = "finish") -> None:
        """Done with a message a sink took (any thread).

        Args:
            message: The message.
            outcome: ``"finish"`` FINs it unless it was answered by hand or its auto
                response disabled; ``"requeue"`` REQs it as a failed handler would (the
                delay policy, backoff); ``"back"`` gives it back for redelivery now without
                counting a failure. Nothing is sent for a message already answered.
        """
        self._answers.settle(message, outcome)

    def settle_all(self, messages: list[Message], outcome: Outcome = "finish") -> None:
        """``settle`` for many messages at once: one hand-over to the loop instead of one
        each (any thread; the list is taken over).

        Args:
            messages: The messages.
            outcome: As for ``settle``, the same for every message.
        """
        self._answers.settle_all(messages, outcome)

    def set_raw(self, sink: RawSink) -> None:
        """Hand classic reads whole to ``sink(subscription, buffer, spans)`` on the loop, as
        they came: no Message is made, nothing is answered or counted against
        ``max_attempts``. The sink answers every id through ``subscription.answers``
        (``finish_ids``, ``requeue_ids``, ``touch_ids``), on the loop. Messages of other
        kinds (Youzan), and those arriving while the consumer stops, go the usual way.

        Args:
            sink: Called on the loop with each read; each frame's data in the buffer is
                ``[timestamp][attempts][id][body]`` between its span's start and end.
        """
        self._intake.set_raw_sink(sink)
