"""One subscribed connection's state: RDY, in flight, the message layout, and who answers."""

from __future__ import annotations

import contextlib
import time
from typing import Protocol

from smartnsq.consumer.message import Answerer, Message
from smartnsq.errors import ConnectionClosed
from smartnsq.net.connection import Connection
from smartnsq.protocol import commands
from smartnsq.protocol.message import CLASSIC, MessageLayout
from smartnsq.protocol.offsets import Skip

Target = tuple[str, int | None]  # (nsqd tcp address, partition or None)


class IdAnswerer(Answerer, Protocol):
    """An :class:`~smartnsq.consumer.message.Answerer` that also answers a subscription's
    message ids in one write each, for a sink that keeps reads as they came (on the loop)."""

    def finish_ids(self, sub: Subscription, ids: list[bytes]) -> None: ...

    def requeue_ids(self, sub: Subscription, ids: list[bytes]) -> None: ...

    def touch_ids(self, sub: Subscription, ids: list[bytes]) -> None: ...


class Subscription:
    """One subscribed connection and its RDY bookkeeping.

    Public for the consumer's sinks: ``address``, ``partition``, ``layout`` and ``answers``
    (what FINs, REQs and TOUCHes the messages it delivered).
    """

    __slots__ = (
        "address",
        "answers",
        "batch_time",
        "conn",
        "held",
        "in_flight",
        "last_attempts",
        "last_id",
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
        answers: IdAnswerer,
        address: str,
        conn: Connection,
        partition: int | None = None,
        *,
        ordered: bool = False,
        ext: bool = False,
        offsets: bool = False,
    ) -> None:
        self.answers = answers
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
            self.layout = CLASSIC
        # Whether the ordered hot path (Intake.on_ordered) suits this subscription's
        # messages; Intake.attach adds the consumer's conditions, on_ordered the moment's.
        self.straight = ordered and partition is not None and youzan and not ext
        # An ordered partition delivers one message at a time whatever RDY says.
        self.max_rdy = 1 if ordered else conn.features.max_rdy_count
        self.rdy = 0
        self.rdy_left = 0
        self.in_flight = 0
        # Ordered: the message last handed on, wherever it waits (a worker, the queue, a
        # sink's thread): auto-touch keeps it alive, as its partition waits for it.
        self.held: Message | None = None
        self.received = 0
        # Ordered: the id and attempts of the message last handed on (see Intake.repeats).
        self.last_id = b""
        self.last_attempts = 0
        now = time.monotonic()
        self.last_message = now
        self.rdy_since = now
        self.batch_time = now

    def took(self, n: int, now: float) -> None:
        """``n`` messages arrived at ``now``: in flight until answered (see
        :func:`smartnsq.consumer.message.write_fin`), and taken from the RDY window."""
        self.in_flight += n
        self.rdy_left -= n
        self.received += n
        self.last_message = now

    def queue(self, data: bytes) -> None:
        """Send ``data`` soon, coalesced with other commands (a TOUCH)."""
        self.conn.queue(data)

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
