"""A Consumer whose messages are taken in batches by a synchronous caller and answered later.

Spark calls the reader from a plain thread; the Consumer runs on this process's event loop
thread (see :mod:`smartnsq.spark.loop`). Messages wait in a buffer, unanswered, until the
caller takes them; the caller FINs them when Spark no longer needs them. Everything received
and not yet FINed is TOUCHed regularly so that nsqd does not hand it to someone else.

Classic reads are kept as they came (the read buffer and its frames' spans): no Message is
made for them, and the rows are cut straight from the buffer. Messages of other kinds (Youzan)
come through the handler as Messages.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import anyio

from smartnsq.consumer import Consumer, Subscription
from smartnsq.consumer.message import Message
from smartnsq.errors import NSQError
from smartnsq.protocol.frames import Span
from smartnsq.protocol.message import span_ids
from smartnsq.spark import loop
from smartnsq.spark.options import Settings

DEFAULT_TOUCH_INTERVAL = 10.0  # well under nsqd's default --msg-timeout of 60 s
# nsqd lets one connection hold at most --max-rdy-count (default 2500) messages in flight;
# a Spark batch is made of messages held at once, so big batches need several subscriptions.
RDY_PER_CONNECTION = 2500
MAX_SUBSCRIPTIONS = 64

# One classic read: the connection's reader, the read buffer, its message frames' spans.
Raw = tuple[Subscription, bytes, list[Span]]


def raw_ids(src: bytes, spans: list[Span]) -> list[bytes]:
    """The message ids of a classic read's frames."""
    return span_ids(src, spans)


class Taken:
    """Messages taken from a :class:`Feed` together: classic reads as they came, and
    decoded messages."""

    __slots__ = ("count", "messages", "raw")

    def __init__(self) -> None:
        self.raw: list[Raw] = []
        self.messages: list[Message] = []
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def add(self, item: Raw | Message) -> None:
        if isinstance(item, tuple):
            self.raw.append(item)
            self.count += len(item[2])
        else:
            self.messages.append(item)
            self.count += 1

    def raw_by_reader(self) -> Iterator[tuple[Subscription, list[bytes]]]:
        for reader, src, spans in self.raw:
            yield reader, raw_ids(src, spans)


class Feed:
    """Running Consumers for ``settings`` whose messages are held until answered.

    ``max_in_flight`` (or the ``nsq.max_in_flight`` option) is the most messages held at
    once, spread over enough subscriptions to the channel for nsqd to allow it.
    """

    def __init__(self, settings: Settings, max_in_flight: int) -> None:
        given = dict(settings.client).get("max_in_flight")
        total = int(given) if given is not None else max_in_flight
        count = max(1, min(MAX_SUBSCRIPTIONS, -(-total // RDY_PER_CONNECTION)))
        # max_attempts=0: a Consumer must never FIN ("give up on") a message by itself; only
        # Spark's progress may.
        kwargs: dict[str, Any] = {"max_attempts": 0, **settings.client_kwargs()}
        kwargs["max_in_flight"] = -(-total // count)
        assert settings.topic is not None and settings.channel is not None
        self.consumers = [
            Consumer(settings.topic, settings.channel, self._on_message, **kwargs)
            for _ in range(count)
        ]
        for consumer in self.consumers:
            consumer.sinks.set_raw(self._on_raw)
        # Raw reads and Messages in arrival order; only take() removes from the left.
        self.buffer: deque[Raw | Message] = deque()
        self.arrived = threading.Event()
        self._closing = False
        # Batches taken and not yet answered (touched with the buffer); a batch leaves as a
        # whole when it is answered, so there is no per-message bookkeeping.
        self.held: list[Taken] = []
        interval = settings.touch_interval
        if interval is None:
            timeout = dict(settings.client).get("msg_timeout")
            interval = timeout / 3 if timeout else DEFAULT_TOUCH_INTERVAL
        self.touch_interval = interval
        self._loop = loop.loop()
        self._cms = [self._loop.portal.wrap_async_context_manager(c) for c in self.consumers]
        for cm in self._cms:
            cm.__enter__()
        self._toucher = self._loop.portal.start_task_soon(self._touch_loop)

    def _arrived(self) -> None:
        # Event.set takes a lock and notifies every time: only wake a waiter that cleared it.
        # take() clears it before it looks at the buffer, so no message is missed.
        if not self.arrived.is_set():
            self.arrived.set()

    def _on_raw(self, reader: Subscription, src: bytes, spans: list[Span]) -> None:
        if self._closing:  # arrived after close() gave everything back: give it back too
            reader.answers.requeue_ids(reader, raw_ids(src, spans))
            return
        self.buffer.append((reader, src, spans))
        self._arrived()

    async def _on_message(self, msg: Message) -> None:
        # async: it runs on the loop (a plain def handler would get a worker thread)
        msg.disable_auto_response()
        if self._closing:
            with contextlib.suppress(NSQError):
                msg.requeue(0, backoff=False)
            return
        self.buffer.append(msg)
        self._arrived()

    def _close_gate(self) -> None:
        self._closing = True
        # RDY 0 first: what is given back below would otherwise come straight back to us.
        self._pause()

    def take(self, limit: int, first_wait: float, gap: float) -> Taken:
        """Up to ``limit`` messages: waits ``first_wait`` for the first one, then stops once
        none came for ``gap`` seconds or nsqd will send no more (every RDY is used)."""
        out = Taken()
        buffer = self.buffer
        wait = first_wait
        while out.count < limit:
            while buffer and out.count < limit:
                item = buffer.popleft()
                room = limit - out.count
                if isinstance(item, tuple) and len(item[2]) > room:
                    # split the read: the rest goes back, first in line
                    reader, src, spans = item
                    buffer.appendleft((reader, src, spans[room:]))
                    item = (reader, src, spans[:room])
                out.add(item)
            if out.count >= limit:
                break
            if out.count and all(c.is_starved() for c in self.consumers):
                break
            self.arrived.clear()
            if buffer:
                continue
            if not self.arrived.wait(wait):
                break
            wait = gap
        if out.count:
            self._loop.portal.call(self.held.append, out)
        return out

    def connected(self) -> bool:
        """Whether some subscription to nsqd is up now."""
        return self._loop.portal.call(self._connected)

    def _connected(self) -> bool:
        return any(c.stats().connections for c in self.consumers)

    def pause(self) -> None:
        """RDY 0 on every connection. Sent before the last FINs, it keeps nsqd from sending
        more to a reader that is about to close: messages still on their way when the
        connection closes would stay in flight in nsqd until their timeout."""
        self._loop.portal.call(self._pause)

    def _pause(self) -> None:
        for consumer in self.consumers:
            consumer.set_max_in_flight(0)

    def finish(self, batches: Iterable[Taken]) -> None:
        """FIN every message of ``batches``, as returned by :meth:`take` (on the loop
        thread, where the connections live)."""
        self._loop.portal.call(self._answer, list(batches), True)

    def requeue(self, batches: Iterable[Taken]) -> None:
        """Give the messages of ``batches`` back to nsqd for immediate redelivery."""
        self._loop.portal.call(self._answer, list(batches), False)

    def _answer(self, batches: list[Taken], fin: bool) -> None:
        self.held = [held for held in self.held if not any(held is b for b in batches)]
        for batch in batches:
            for reader, ids in batch.raw_by_reader():
                if fin:
                    reader.answers.finish_ids(reader, ids)
                else:
                    reader.answers.requeue_ids(reader, ids)
            for msg in batch.messages:
                if msg.has_responded:
                    continue
                try:
                    if fin:
                        msg.finish()
                    else:
                        msg.requeue(0, backoff=False)
                except NSQError:
                    pass  # its connection is gone: nsqd redelivers it, which is what we want

    async def _touch_loop(self) -> None:
        while True:
            await anyio.sleep(self.touch_interval)
            waiting = Taken()
            for item in list(self.buffer):
                waiting.add(item)
            for batch in [*self.held, waiting]:
                for reader, ids in batch.raw_by_reader():
                    reader.answers.touch_ids(reader, ids)
                for msg in batch.messages:
                    if not msg.has_responded:
                        with contextlib.suppress(NSQError):
                            msg.touch()

    def close(self) -> None:
        """Give back everything still buffered or held, then stop the Consumer."""
        self._toucher.cancel()
        # From now on a message that arrives (sent before nsqd saw RDY 0) is requeued as it
        # comes; otherwise it would sit in flight until its timeout.
        self._loop.portal.call(self._close_gate)
        rest = Taken()
        while self.buffer:
            rest.add(self.buffer.popleft())
        self.requeue([*self.held, rest])
        # All at once: each stop reads on for a while after its CLS (see consumer.drain).
        self._loop.portal.call(self._stop_all)
        for cm in self._cms:
            cm.__exit__(None, None, None)  # already stopped: this only ends its task

    async def _stop_all(self) -> None:
        async with anyio.create_task_group() as tg:
            for consumer in self.consumers:
                tg.start_soon(consumer.stop)
