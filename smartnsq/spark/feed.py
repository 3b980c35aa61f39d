"""A Consumer whose messages are taken in batches by a synchronous caller and answered later.

Spark calls the reader from a plain thread; the Consumer runs on this process's event loop
thread (see :mod:`smartnsq.spark.loop`). Messages wait in a buffer, unanswered, until the
caller takes them; the caller FINs them when Spark no longer needs them. Everything received
and not yet FINed is TOUCHed regularly so that nsqd does not hand it to someone else.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Iterable
from typing import Any

import anyio

from smartnsq.consumer import Consumer
from smartnsq.errors import NSQError
from smartnsq.message import Message
from smartnsq.spark import loop
from smartnsq.spark.options import Settings

DEFAULT_TOUCH_INTERVAL = 10.0  # well under nsqd's default --msg-timeout of 60 s
# nsqd lets one connection hold at most --max-rdy-count (default 2500) messages in flight;
# a Spark batch is made of messages held at once, so big batches need several subscriptions.
RDY_PER_CONNECTION = 2500
MAX_SUBSCRIPTIONS = 32


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
        self.buffer: deque[Message] = deque()
        self.arrived = threading.Event()
        self._closing = False
        self.held: set[Message] = set()  # taken, not yet answered; touched with the buffer
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

    async def _on_message(self, msg: Message) -> None:
        # async: it runs on the loop (a plain def handler would get a worker thread)
        msg.disable_auto_response()
        if self._closing:  # arrived after close() gave everything back: give it back too
            with contextlib.suppress(NSQError):
                msg.requeue(0, backoff=False)
            return
        self.buffer.append(msg)
        self.arrived.set()

    def _close_gate(self) -> None:
        self._closing = True

    def take(self, limit: int, first_wait: float, gap: float) -> list[Message]:
        """Up to ``limit`` messages: waits ``first_wait`` for the first one, then stops once
        none came for ``gap`` seconds or nsqd will send no more (every RDY is used)."""
        out: list[Message] = []
        buffer = self.buffer
        wait = first_wait
        while len(out) < limit:
            while buffer and len(out) < limit:
                out.append(buffer.popleft())
            if len(out) >= limit:
                break
            if out and all(c.is_starved() for c in self.consumers):
                break
            self.arrived.clear()
            if buffer:
                continue
            if not self.arrived.wait(wait):
                break
            wait = gap
        self._loop.portal.call(self.held.update, out)
        return out

    def pause(self) -> None:
        """RDY 0 on every connection. Sent before the last FINs, it keeps nsqd from sending
        more to a reader that is about to close: messages still on their way when the
        connection closes would stay in flight in nsqd until their timeout."""
        self._loop.portal.call(self._pause)

    def _pause(self) -> None:
        for consumer in self.consumers:
            consumer.set_max_in_flight(0)

    def finish(self, messages: Iterable[Message]) -> None:
        """FIN ``messages`` (on the loop thread, where the connections live)."""
        self._loop.portal.call(self._answer, list(messages), True)

    def requeue(self, messages: Iterable[Message]) -> None:
        """Give ``messages`` back to nsqd for immediate redelivery."""
        self._loop.portal.call(self._answer, list(messages), False)

    def _answer(self, messages: list[Message], fin: bool) -> None:
        for msg in messages:
            self.held.discard(msg)
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
            for msg in [*self.held, *list(self.buffer)]:
                if not msg.has_responded:
                    with contextlib.suppress(NSQError):
                        msg.touch()

    def close(self) -> None:
        """Give back everything still buffered or held, then stop the Consumer."""
        self._toucher.cancel()
        # From now on a message that arrives (the consumers' RDY is still open until they
        # stop) is requeued as it comes; otherwise it would sit in flight until its timeout.
        self._loop.portal.call(self._close_gate)
        self.requeue([*self.held, *self.buffer])
        self.buffer.clear()
        for cm in self._cms:
            cm.__exit__(None, None, None)
