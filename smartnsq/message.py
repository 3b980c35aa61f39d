"""The message a consumer hands to user code."""

from __future__ import annotations

from typing import Protocol

from smartnsq._checks import check_requeue_delay
from smartnsq.protocol.message import MessageLayout, RawMessage


class Answerer(Protocol):
    """What answers a delivered message: the consumer's side of FIN, REQ and TOUCH.

    Each may be called from any thread: off the event loop's thread it is carried over to
    the loop, in order. ``on_loop`` tells which it is.
    """

    def on_loop(self) -> bool: ...

    def finish(self, msg: Message) -> None: ...

    def requeue(self, msg: Message, delay: float | None, backoff: bool) -> None: ...

    def touch(self, msg: Message) -> None: ...


class Origin(Protocol):
    """Where a message came from: the subscription that delivered it, and who answers."""

    @property
    def address(self) -> str: ...

    @property
    def partition(self) -> int | None: ...

    @property
    def layout(self) -> MessageLayout: ...

    @property
    def answers(self) -> Answerer: ...


class Message(RawMessage):
    """A delivered message.

    The consumer answers it for you: FIN when the handler returns, REQ when it returns
    ``False`` or raises. Take over with [`finish`][smartnsq.Message.finish],
    [`requeue`][smartnsq.Message.requeue] and [`touch`][smartnsq.Message.touch] (they queue
    the command and return at once), or with
    [`disable_auto_response`][smartnsq.Message.disable_auto_response] to answer later, from
    anywhere: called from another thread (a plain ``def`` handler runs in a worker thread),
    they are carried over to the event loop, in order. A message is answered once: a second
    answer raises [`NSQError`][smartnsq.errors.NSQError].

    On the Youzan fork, ``partition``, ``internal_id``, ``trace_id``, ``headers`` and (for
    ordered topics, and with the consumer's ``advanced=True`` or ``start``) ``offset`` (the
    queue offset) and ``raw_size`` describe where it came from.

    Attributes:
        body: The message body (bytes).
        id: The 16-byte message id, echoed back in FIN, REQ and TOUCH (classic nsqd: 16 hex
            characters; Youzan: the 8-byte internal id then the 8-byte trace id).
        attempts: How many times nsqd has delivered it, this delivery included (1 the first
            time).
        timestamp: When it was published, in nanoseconds since the epoch.
        offset: Youzan ordered or advanced subscriptions: the message's queue offset in its
            partition (a byte position; else None).
        raw_size: Youzan ordered or advanced subscriptions: its size in the partition's queue
            (else None).
        ext_version: Youzan ext topics: the ext header's format (0: none, 4: JSON).
        ext: Youzan ext topics: the raw ext header (else None); ``headers`` decodes it.
    """

    # The delivery's state, set by the consumer (smartnsq.consumer) that delivers it: where
    # it came from, whether it was answered, whether the consumer answers it.
    __slots__ = ("_auto", "_reader", "_received", "_responded", "_touched")

    _reader: Origin
    _responded: bool
    _auto: bool
    _received: float
    _touched: float

    @property
    def nsqd_address(self) -> str:
        """``host:port`` of the nsqd that delivered the message."""
        return self._reader.address

    @property
    def partition(self) -> int | None:  # type: ignore[override]
        """The Youzan partition (``None`` from classic nsqd)."""
        reader = self._reader
        if reader.partition is not None:
            return reader.partition
        return RawMessage.partition.fget(self) if reader.layout.binary_id else None  # type: ignore[attr-defined]

    @property
    def has_responded(self) -> bool:
        """Whether the message was answered (FIN or REQ), by the consumer or by hand."""
        return self._responded

    def finish(self) -> None:
        """Tell nsqd the message is done (FIN).

        Raises:
            NSQError: The message was already answered (called from another thread, this
                is logged as a warning instead).
        """
        answers = self._reader.answers
        if not answers.on_loop():
            self._auto = False  # answered by hand: the thread must not FIN it as well
        answers.finish(self)

    def requeue(self, delay: float | None = None, *, backoff: bool = True) -> None:
        """Give the message back for redelivery after ``delay`` seconds (REQ).

        nsqd caps the delay at its ``--max-req-timeout`` (1 hour by default). On an ordered
        partition the delay is always 0: the message must come back at once.

        Args:
            delay: Seconds before nsqd delivers it again (>= 0). ``None`` (default): the
                consumer's policy, ``requeue_delay`` times the attempts, capped by
                ``max_requeue_delay``.
            backoff: Whether this counts as a failure for the consumer's backoff. Default
                True; pass False to retry later without slowing the consumer down.

        Raises:
            InvalidArgument: ``delay`` is negative or too large.
            InvalidType: ``delay`` is not a number.
            NSQError: The message was already answered (called from another thread, this
                is logged as a warning instead).
        """
        if delay is not None:
            delay = check_requeue_delay(delay)
        answers = self._reader.answers
        if not answers.on_loop():
            self._auto = False
        answers.requeue(self, delay, backoff)

    def touch(self) -> None:
        """Reset nsqd's timeout for this message (TOUCH), to keep it while a handler runs long.

        nsqd never extends it beyond its ``--max-msg-timeout`` (15 minutes by default) since
        delivery. The consumer's ``auto_touch=True`` does this for you.

        Raises:
            NSQError: The message was already answered (called from another thread, the
                TOUCH is then simply dropped).
        """
        self._reader.answers.touch(self)

    def disable_auto_response(self) -> None:
        """Stop the consumer from answering the message when the handler returns or raises.

        Answer it later with [`finish`][smartnsq.Message.finish] or
        [`requeue`][smartnsq.Message.requeue] (from any thread), before nsqd's message
        timeout runs out (or [`touch`][smartnsq.Message.touch] it). A graceful stop does not
        requeue such a message once its handler has returned.
        """
        self._auto = False


def id_text(msg: Message) -> str:
    """The message id as nsqd shows it, for log lines.

    Classic nsqd ids are 16 ASCII hex characters: shown as that text. Youzan ids are an
    8-byte internal id and an 8-byte trace id, which its nsqd logs and HTTP API show as
    decimal numbers: the internal id, with the trace id when there is one.
    """
    mid = msg.id
    if msg._reader.layout.binary_id:
        trace = msg.trace_id
        return f"{msg.internal_id} (trace id {trace})" if trace else str(msg.internal_id)
    if mid.isascii() and mid.isalnum():
        return mid.decode()
    return mid.hex()
