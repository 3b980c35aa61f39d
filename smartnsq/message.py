"""The message a consumer hands to user code."""

from __future__ import annotations

from typing import TYPE_CHECKING

from smartnsq._checks import check_requeue_delay
from smartnsq.protocol.message import RawMessage

if TYPE_CHECKING:
    from smartnsq.consumer import _Reader


class Message(RawMessage):
    """A delivered message.

    The consumer answers it for you: FIN when the handler returns, REQ when it returns
    ``False`` or raises. Take over with :meth:`finish`, :meth:`requeue` and :meth:`touch`
    (they queue the command and return at once), or with :meth:`disable_auto_response` to
    answer later, from anywhere: called from another thread (a plain ``def`` handler runs in
    a worker thread), they are carried over to the event loop, in order.

    On the Youzan fork, :attr:`partition`, :attr:`internal_id`, :attr:`trace_id`, and (for
    ordered topics, and with the consumer's ``advanced=True`` or ``start``)
    :attr:`offset` (the queue offset) and :attr:`raw_size` describe where it came from.
    """

    __slots__ = ("_auto", "_reader", "_received", "_responded", "_touched")

    _reader: _Reader
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
        return self._responded

    def finish(self) -> None:
        """Tell nsqd the message is done (FIN)."""
        consumer = self._reader.consumer
        if not consumer._on_loop():
            self._auto = False  # answered by hand: the thread must not FIN it as well
        consumer._from_anywhere(consumer._finish, self)

    def requeue(self, delay: float | None = None, *, backoff: bool = True) -> None:
        """Give the message back for redelivery after ``delay`` seconds (REQ).

        ``delay=None`` uses the consumer's policy (a multiple of the attempts, capped).
        ``backoff=False`` does not count this as a failure for the consumer's backoff.
        nsqd caps the delay at its ``--max-req-timeout`` (1 hour by default).
        """
        if delay is not None:
            delay = check_requeue_delay(delay)
        consumer = self._reader.consumer
        if not consumer._on_loop():
            self._auto = False
        consumer._from_anywhere(consumer._requeue, self, delay, backoff)

    def touch(self) -> None:
        """Reset the server's timeout for this message (TOUCH)."""
        consumer = self._reader.consumer
        if consumer._on_loop():
            consumer._touch(self)
        else:  # the FIN may overtake it: then it has nothing left to do
            consumer._from_anywhere(consumer._touch_unless_answered, self)

    def disable_auto_response(self) -> None:
        """Stop the consumer from answering the message when the handler returns or raises."""
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
