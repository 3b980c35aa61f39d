"""The consumer's dead-letter topic: a message it gives up on is published there first, and
finished only once nsqd acknowledged the copy; if the copy fails, the original is requeued
with backoff, never finished, so nothing is lost (see :mod:`smartnsq.deadletter`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

import anyio

from smartnsq.consumer.state import State
from smartnsq.deadletter import DeadLetters, LastErrors
from smartnsq.errors import NSQError
from smartnsq.message import Message, id_text

if TYPE_CHECKING:
    from smartnsq.producer import Producer

log = logging.getLogger("smartnsq.consumer")


class Settle(Protocol):
    """What the dead-letter part asks of the consumer's answers."""

    discarded: int

    def fin(self, msg: Message, count: bool = True) -> None: ...

    def req(self, msg: Message, delay: float | None, backoff: bool) -> None: ...


class DeadLetterTopic:
    """Owns the producer of the dead-letter copies (started with the consumer, on its
    cluster and with its connection settings) and the last failure of each message."""

    def __init__(self, state: State, topic: str) -> None:
        options = state.options
        self.state = state
        self.letters = DeadLetters(topic, options.topic, options.channel)
        self.errors = LastErrors()
        self.producer: Producer | None = None

    async def run(self) -> None:
        """The producer's life: from the consumer's start until its task group ends."""
        from smartnsq.producer import Producer  # only consumers with a dead-letter topic

        options = self.state.options
        config = options.config
        async with Producer(
            options.direct,
            lookupd_http_addresses=options.lookupds,
            tls=config.tls,
            tls_hostname=config.tls_hostname,
            snappy=config.snappy,
            deflate=config.deflate,
            deflate_level=config.deflate_level,
            auth_secret=config.auth_secret,
            auth_over_plaintext=config.auth_over_plaintext,
            connect_timeout=config.connect_timeout,
            client_id=config.client_id,
        ) as producer:
            self.producer = producer
            try:
                await anyio.sleep_forever()  # closed when the consumer's task group ends
            finally:
                self.producer = None

    def give_up(self, msg: Message, answers: Settle) -> None:
        self.state.spawn(self._send, msg, answers)

    async def _send(self, msg: Message, answers: Settle) -> None:
        producer = self.producer
        error = self.errors.pop(msg)
        try:
            if producer is None:
                raise NSQError("the dead-letter producer is not running")
            await self.letters.send(producer, msg, error)
        except NSQError as exc:
            log.warning(
                "could not publish message %s to dead-letter topic %s (%s): requeued, not finished",
                id_text(msg),
                self.letters.topic,
                exc,
            )
            if error is not None:
                self.errors.failed(msg, error)  # for the next give-up
            if not msg._responded:
                answers.req(msg, None, True)
            return
        answers.discarded += 1
        callback = self.state.options.on_giving_up
        if callback is not None:
            self.state.call_back("on_giving_up", callback, msg)
        if not msg._responded:
            answers.fin(msg, count=False)
