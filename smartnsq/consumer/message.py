"""The delivery: the message a consumer hands to user code, and the one place that makes
it and answers it.

The consumer's parts (intake, handler threads, workers, answers, drain, dead letters) make
a :class:`Message` from a frame span with :func:`delivered` (or its inlined forms for the
hot paths: :func:`delivered_read`, :func:`delivered_at`, :func:`delivered_ordered`), answer
it with :func:`write_fin`, :func:`write_req` and :func:`write_touch` (a run of ids with
:func:`write_fins`, :func:`write_reqs` and :func:`write_touches`; the async worker's FIN
with :func:`fin_owed`, a handler thread's with :func:`claim_fin`), and read its delivery
state through :func:`owed`, :func:`sub_of` and :func:`times`: nothing else touches it. The
layout and the bytes come from :mod:`smartnsq.protocol`. The hot paths are inlined here,
each with the measurement that justifies it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Protocol

from smartnsq._checks import check_requeue_delay
from smartnsq.errors import ConnectionClosed, NSQError, ProtocolError
from smartnsq.protocol import commands
from smartnsq.protocol.commands import FIN_FORMAT
from smartnsq.protocol.frames import FRAME_HEAD, SIZE_BIAS, Span, unpack_size
from smartnsq.protocol.message import (
    EXT_NONE,
    HEAD_SIZE,
    ID_AT,
    OFFSET_HEAD,
    OFFSET_HEAD_SIZE,
    MessageLayout,
    RawMessage,
    check_spans,
    decode_span,
    unpack_head,
)

log = logging.getLogger("smartnsq.consumer")
unpack_offset_head = OFFSET_HEAD.unpack_from


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
    """Where a message came from: the subscription that delivered it, and who answers.

    ``in_flight`` counts its messages not answered yet; ``write`` sends an answer on its
    connection, ``queue`` a TOUCH (both raise ``ConnectionClosed`` once it is going down).
    """

    in_flight: int

    def write(self, data: bytes) -> None: ...

    def queue(self, data: bytes) -> None: ...

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

    # The delivery's state, set by delivered() below: the subscription it came from, whether
    # it was answered, whether the consumer answers it, when it came and was last touched
    # (those two only for auto-touched and ordered messages).
    __slots__ = ("_auto", "_received", "_responded", "_sub", "_touched")

    _sub: Origin
    _responded: bool
    _auto: bool
    _received: float
    _touched: float

    @property
    def nsqd_address(self) -> str:
        """``host:port`` of the nsqd that delivered the message."""
        return self._sub.address

    @property
    def partition(self) -> int | None:  # type: ignore[override]
        """The Youzan partition (``None`` from classic nsqd)."""
        sub = self._sub
        if sub.partition is not None:
            return sub.partition
        return RawMessage.partition.fget(self) if sub.layout.binary_id else None  # type: ignore[attr-defined]

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
        answers = self._sub.answers
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
        answers = self._sub.answers
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
        self._sub.answers.touch(self)

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
    if msg._sub.layout.binary_id:
        trace = msg.trace_id
        return f"{msg.internal_id} (trace id {trace})" if trace else str(msg.internal_id)
    if mid.isascii() and mid.isalnum():
        return mid.decode()
    return mid.hex()


# -- the consumer's side: making a delivery, and answering it ------------------------------------

# The hot paths make a message without calling its constructor: a bare instance, every
# field set in place (each of RawMessage's, which the tests check against delivered()).
# Calling RawMessage.__init__ is a Python call with eight arguments per message.
_bare = object.__new__


def delivered(sub: Origin, src: bytes, start: int, end: int, now: float | None = None) -> Message:
    """The message whose frame data is ``src[start:end]``, delivered by ``sub``: unanswered,
    answered by the consumer. ``now``: when it came, for auto-touch (else left unset: the
    touch loop never looks at it).

    Raises:
        ProtocolError: The frame is too short for its layout.
    """
    msg = decode_span(src, start, end, sub.layout, Message)
    msg._sub = sub
    msg._responded = False
    msg._auto = True
    if now is not None:
        msg._received = msg._touched = now
    return msg


def delivered_at(sub: Origin, src: bytes, start: int) -> Message:
    """:func:`delivered` for a classic message frame whose data starts at ``start`` (its end
    read from the frame's size field): a handler thread's hot path, which keeps only the
    starts of a read's frames.

    Inlined (frames.data_end, decode_span and the constructor, see ``_bare``): a handler
    thread's loop took 460 ns a message through delivered(), 410 with the message made in
    the loop by its constructor, 350 so (3.11, 100-byte bodies).

    Raises:
        ProtocolError: The frame is too short for its head.
    """
    end = start - SIZE_BIAS + unpack_size(src, start - FRAME_HEAD)[0]
    if end - start < HEAD_SIZE:
        check_spans([(0, start, end)])  # raises
    msg = _bare(Message)
    msg.timestamp, msg.attempts = unpack_head(src, start)
    msg.id = src[start + ID_AT : start + HEAD_SIZE]
    msg.body = src[start + HEAD_SIZE : end]
    msg.ext_version = EXT_NONE
    msg.ext = msg.offset = msg.raw_size = None
    msg._sub = sub
    msg._responded = False
    msg._auto = True
    return msg


def delivered_read(sub: Origin, src: bytes, spans: list[Span]) -> list[Message]:
    """:func:`delivered` for every message frame of a classic read: intake's hot path.

    Inlined, with no call per message (see ``_bare``): through :func:`delivered` intake's
    loop took 385 ns a message, 305 with the message made in the loop by its constructor,
    270 so (3.11, 100-byte bodies).

    Raises:
        ProtocolError: A frame is too short for its head.
    """
    out: list[Message] = []
    append = out.append
    for _, start, end in spans:
        if end - start < HEAD_SIZE:
            check_spans([(0, start, end)])  # raises
        msg = _bare(Message)
        msg.timestamp, msg.attempts = unpack_head(src, start)
        msg.id = src[start + ID_AT : start + HEAD_SIZE]
        msg.body = src[start + HEAD_SIZE : end]
        msg.ext_version = EXT_NONE
        msg.ext = msg.offset = msg.raw_size = None
        msg._sub = sub
        msg._responded = False
        msg._auto = True
        append(msg)
    return out


def delivered_ordered(
    sub: Origin, src: bytes, start: int, end: int, now: float
) -> tuple[Message, int]:
    """:func:`delivered` for a message frame of an ordered subscription without ext
    headers (intake's ordered hot path), with its internal id (which the order check
    needs).

    Inlined, with no call: an ordered partition is round-trip bound, each step counts.
    With :func:`write_fin` inlined too, an ordered message's way from read to FIN took
    2.15 us (3.11), against 2.45 through delivered(), the internal_id property and the
    helpers write_fin calls (2.07 with all of it spelled out in intake and answers).

    Raises:
        ProtocolError: The frame ends before its offset block.
    """
    if end - start < OFFSET_HEAD_SIZE:
        raise ProtocolError("message frame ends before its offset block")
    msg = _bare(Message)
    msg.timestamp, msg.attempts, internal_id, msg.offset, msg.raw_size = unpack_offset_head(
        src, start
    )
    msg.id = src[start + ID_AT : start + HEAD_SIZE]
    msg.body = src[start + OFFSET_HEAD_SIZE : end]
    msg.ext_version = EXT_NONE
    msg.ext = None
    msg._sub = sub
    msg._responded = False
    msg._auto = True
    msg._received = msg._touched = now
    return msg, internal_id


def owed(msg: Message) -> bool:
    """Whether the consumer still owes ``msg`` its answer: not answered yet, by hand or
    otherwise, and its auto response not disabled."""
    return msg._auto and not msg._responded


def claim_fin(msg: Message) -> bool:
    """For a handler thread that queues the id of a message it finishes, for a later
    :func:`write_fins`: mark ``msg`` answered if the consumer owes it its answer."""
    if msg._auto and not msg._responded:
        msg._responded = True
        return True
    return False


def fin_owed(msg: Message) -> bool | None:
    """The async worker's answer once its handler returned (not False): FIN ``msg`` if the
    consumer owes it its answer (else None); False when its connection is gone.

    :func:`owed` and :func:`write_fin` inlined, with the FIN formatted in place (the id was
    cut from a frame: 16 bytes): the worker does this once per message. Through owed(),
    Answers.fin and write_fin it took 210 ns a message, inlined 110 (the worker's loop
    itself, 3.11).
    """
    if not msg._auto or msg._responded:
        return None
    msg._responded = True
    sub = msg._sub
    sub.in_flight -= 1  # as write_fin does
    try:
        sub.write(FIN_FORMAT % msg.id)
    except ConnectionClosed:
        _lost(msg, "finish")
        return False
    return True


def sub_of(msg: Message) -> Origin:
    """The subscription that delivered ``msg``."""
    return msg._sub


def times(msg: Message) -> tuple[float, float]:
    """When ``msg`` came and when it was last touched (set for auto-touched and ordered
    messages only)."""
    return msg._received, msg._touched


def _answered(msg: Message) -> Origin:
    if msg._responded:
        raise NSQError(f"message {id_text(msg)} was already answered")
    msg._responded = True
    return msg._sub


def _send(sub: Origin, n: int, data: bytes) -> bool:
    """Write the answers to ``n`` messages of ``sub``; False when its connection is gone."""
    sub.in_flight -= n  # answered messages leave the count (write_fin, fin_owed inline it)
    try:
        sub.write(data)
    except ConnectionClosed:
        return False
    return True


def write_fin(msg: Message) -> bool:
    """FIN ``msg``; False when its connection is gone (nsqd redelivers it).

    Raises:
        NSQError: It was answered already.
    """
    # _answered and _send inlined: every message's FIN but the async worker's (see
    # fin_owed) comes here; see delivered_ordered for what it saves.
    if msg._responded:
        raise NSQError(f"message {id_text(msg)} was already answered")
    msg._responded = True
    sub = msg._sub
    sub.in_flight -= 1
    try:
        sub.write(FIN_FORMAT % msg.id)
    except ConnectionClosed:
        _lost(msg, "finish")
        return False
    return True


def write_req(msg: Message, delay_ms: int) -> bool:
    """REQ ``msg`` with ``delay_ms``; False when its connection is gone.

    Raises:
        NSQError: It was answered already.
    """
    if _send(_answered(msg), 1, commands.req(msg.id, delay_ms)):
        return True
    _lost(msg, "requeue")
    return False


def write_touch(msg: Message) -> None:
    """TOUCH ``msg`` (dropped when its connection is gone).

    Raises:
        NSQError: It was answered already.
    """
    if msg._responded:
        raise NSQError(f"message {id_text(msg)} was already answered")
    msg._touched = time.monotonic()
    with contextlib.suppress(ConnectionClosed):
        msg._sub.queue(commands.touch(msg.id))


def write_fins(sub: Origin, ids: Sequence[bytes]) -> bool:
    """FIN the messages ``ids`` of ``sub`` (already marked answered, or never made into
    messages) in one write; False when its connection is gone."""
    return _sent_all(_send(sub, len(ids), commands.fins(ids)), sub, ids, "finish")


def write_reqs(sub: Origin, ids: Sequence[bytes], delay_ms: int) -> bool:
    """:func:`write_fins` for REQ with ``delay_ms``."""
    return _sent_all(_send(sub, len(ids), commands.reqs(ids, delay_ms)), sub, ids, "requeue")


def write_touches(sub: Origin, ids: Sequence[bytes]) -> None:
    """TOUCH the messages ``ids`` of ``sub`` in one write (dropped when its connection is
    gone)."""
    with contextlib.suppress(ConnectionClosed):
        sub.write(commands.touches(ids))


def _sent_all(sent: bool, sub: Origin, ids: Sequence[bytes], what: str) -> bool:
    if not sent:
        log.debug(  # the lost connection itself is logged once
            "could not %s %d messages: connection to %s is gone; nsqd will redeliver",
            what,
            len(ids),
            sub.address,
        )
    return sent


def _lost(msg: Message, what: str) -> None:
    log.debug(  # per message; the lost connection itself is logged once
        "could not %s message %s: connection to %s is gone; nsqd will redeliver it",
        what,
        id_text(msg),
        msg._sub.address,
    )
