"""The consumer's dead-letter topic: a message it gives up on is published there first, and
finished only once nsqd acknowledged the copy, so that nothing is lost and it can be replayed
later.

The copy keeps the body. On a Youzan ext topic it also keeps the original's ext headers and
trace id and adds what happened (:data:`FACTS`); topics without headers (classic nsqd, Youzan
topics without ext) cannot carry those facts, so they are logged at WARNING instead, once per
message.

A copy that fails for a reason that may pass (nsqd down or slow, no nsqd listed) leaves the
original requeued, not finished, so nothing is lost; it comes back after a delay that grows
with each failed copy, and it does not slow the consumer down (no backoff): the other
messages keep flowing. A copy the destination refuses for good (``E_BAD_MESSAGE``,
``E_BAD_TOPIC``, ``E_BAD_BODY``) is not tried again: the message is given up on without a
copy (``on_giving_up`` with the reason, an ERROR) and finished. A graceful stop waits for
pending copies (see :mod:`smartnsq.consumer.drain`).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from smartnsq.consumer.message import Message, id_text, sub_of
from smartnsq.consumer.state import State
from smartnsq.consumer.subscription import Subscription
from smartnsq.errors import (
    BadBody,
    BadMessage,
    BadTopic,
    InvalidArgument,
    LookupFailed,
    NSQError,
    TopicNotFound,
)
from smartnsq.lookup.manager import LookupManager
from smartnsq.notice import warn_unheard
from smartnsq.protocol.compress import COMPRESS_KEY, SIZE_KEY

if TYPE_CHECKING:
    from smartnsq.producer import Producer

log = logging.getLogger("smartnsq.consumer")

PREFIX = "smartnsq.dead."
#: The ext header keys a dead-letter copy gets on a Youzan ext topic.
FACTS = tuple(
    PREFIX + k for k in ("topic", "channel", "attempts", "error", "failed_at", "message_id")
)
ERROR_LIMIT = 1024  # bytes of the error's text kept in a header
# Keys of the original that do not describe the copy: it is sent uncompressed (the consumer
# already decompressed the body), and its trace id goes as the publish's own.
_DROPPED = frozenset({COMPRESS_KEY, SIZE_KEY, "##trace_id"})
UNKNOWN = "unknown: the last failure was not seen by this consumer (an earlier delivery)"


class Publisher(Protocol):
    """What a dead-letter topic is published through (a :class:`smartnsq.Producer`)."""

    async def publish(
        self,
        topic: str,
        body: bytes,
        *,
        trace_id: int | None = ...,
        headers: Mapping[str, Any] | None = ...,
    ) -> object: ...

    async def is_ext_topic(self, topic: str) -> bool: ...


def error_text(error: BaseException | None) -> str:
    """``Type: message`` of the handler's last failure, at most 1 KiB of UTF-8."""
    if error is None:
        return UNKNOWN
    text = f"{type(error).__qualname__}: {error}"
    raw = text.encode("utf-8", "replace")
    if len(raw) <= ERROR_LIMIT:
        return text
    return raw[: ERROR_LIMIT - 3].decode("utf-8", "ignore") + "..."


def facts(
    msg: Message, topic: str, channel: str, error: BaseException | None, now_ms: int
) -> dict[str, str]:
    """What the dead-letter copy says of the original (all strings, as ext headers go)."""
    # The id as nsqd shows it: Youzan's internal id in decimal (its trace id travels as the
    # copy's own), classic nsqd's 16 hex characters.
    mid = str(msg.internal_id) if msg.partition is not None else id_text(msg)
    values = (topic, channel, str(msg.attempts), error_text(error), str(now_ms), mid)
    return dict(zip(FACTS, values, strict=True))


class LastErrors:
    """The last handler failure of recent messages, by id, so that the consumer that gives up
    on a message in a later delivery can tell why. Bounded: the oldest are forgotten."""

    def __init__(self, size: int = 10_000) -> None:
        self._size = size
        self._errors: OrderedDict[bytes, BaseException] = OrderedDict()

    def failed(self, msg: Message, error: BaseException) -> None:
        self._errors[msg.id] = error
        self._errors.move_to_end(msg.id)
        if len(self._errors) > self._size:
            self._errors.popitem(last=False)

    def pop(self, msg: Message) -> BaseException | None:
        return self._errors.pop(msg.id, None)

    def __len__(self) -> int:
        return len(self._errors)


class DeadLetters:
    """Publishes given-up messages of ``topic``/``channel`` to ``dead_letter_topic``."""

    def __init__(self, dead_letter_topic: str, topic: str, channel: str) -> None:
        self.topic = dead_letter_topic
        self.source = topic
        self.channel = channel
        self.sent = 0

    async def send(self, publisher: Publisher, msg: Message, error: BaseException | None) -> None:
        """Publish the copy; returns once nsqd acknowledged it. Raises what the publish
        raised (an :class:`~smartnsq.errors.NSQError`): then the original must not be
        finished."""
        told = facts(msg, self.source, self.channel, error, time.time_ns() // 1_000_000)
        # Youzan ids carry a trace id (classic ids are hex text, and have no partition).
        trace_id = (msg.trace_id or None) if msg.partition is not None else None
        if await publisher.is_ext_topic(self.topic):
            original = msg.headers if msg.ext else {}
            headers = {k: v for k, v in original.items() if k not in _DROPPED}
            headers.update(told)
            await publisher.publish(self.topic, msg.body, trace_id=trace_id, headers=headers)
        else:
            await publisher.publish(self.topic, msg.body, trace_id=trace_id)
            log.warning(
                "dead letter: message %s of %s/%s published to %s after %s attempts; "
                "last error: %s (a topic without ext headers cannot carry these facts)",
                told[PREFIX + "message_id"],
                self.source,
                self.channel,
                self.topic,
                msg.attempts,
                told[PREFIX + "error"],
            )
        self.sent += 1


# What no retry can change: the copy itself is what the destination refuses.
REFUSED_FOR_GOOD = (BadMessage, BadTopic, BadBody, InvalidArgument)
# A failed copy's original comes back after 1 s, doubling with each failed copy, up to 60 s
# (and to max_requeue_delay).
RETRY_FIRST = 1.0
RETRY_MOST = 60.0
# The destination nsqd decides what is too large (its --max-msg-size may exceed the
# Producer's default 1 MiB): a copy is checked against this only.
COPY_MAX = 1 << 30


class Settle(Protocol):
    """What the dead-letter part asks of the consumer's answers."""

    discarded: int

    def fin(self, msg: Message, count: bool = True) -> None: ...

    def req(self, msg: Message, delay: float | None, backoff: bool) -> None: ...

    def giving_up(self, msg: Message, reason: Exception | None) -> None: ...

    def touch_now(self, msg: Message) -> None: ...


def retry_delay(msg: Message, max_attempts: int, max_requeue_delay: float) -> float:
    """When the original of a failed copy comes back: the copies failed so far are its
    deliveries past ``max_attempts``."""
    failed = max(1, msg.attempts - max_attempts)
    return min(RETRY_FIRST * 2.0 ** min(failed - 1, 16), RETRY_MOST, max_requeue_delay)


class DeadLetterTopic:
    """Owns the producer of the dead-letter copies (started with the consumer, on its
    cluster and with its connection settings), the last failure of each message, and the
    messages whose copy is under way (``pending``: a graceful stop waits for them)."""

    def __init__(self, state: State, topic: str) -> None:
        options = state.options
        self.state = state
        self.letters = DeadLetters(topic, options.topic, options.channel)
        self.errors = LastErrors()
        self.producer: Producer | None = None
        self.pending: set[Message] = set()
        # Of pending, those with nothing to wait for, which a stop gives back at once: copies
        # asked for but not started (a start asked from a read callback is skipped once the
        # stop began), and ordered messages held between two failed copies.
        self.queued: set[Message] = set()
        self.held: set[Message] = set()

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
            max_message_size=COPY_MAX,
            max_body_size=COPY_MAX + 8,
        ) as producer:
            self.producer = producer
            try:
                await anyio.sleep_forever()  # closed when the consumer's task group ends
            finally:
                self.producer = None

    async def check(self) -> None:
        """At start: on the Youzan fork, where an operator creates topics, a dead-letter topic
        no lookupd knows is an error (:class:`TopicNotFound`), not a loop of failed copies.
        A lookupd that does not answer is no error: each copy asks again."""
        lookupds = self.state.options.lookupds
        if not lookupds:
            return
        topic = self.letters.topic
        async with LookupManager(lookupds) as lookup:
            try:
                await lookup.lookup(topic, "w")
            except TopicNotFound as exc:
                if lookup.fork:
                    raise TopicNotFound(
                        f"dead_letter_topic {topic!r} does not exist: create it (with the "
                        f"fork's topic create API) before starting the consumer ({exc})"
                    ) from None
            except LookupFailed as exc:
                log.debug("could not check dead-letter topic %s at start: %s", topic, exc)

    def give_up(self, msg: Message, answers: Settle) -> None:
        if self.state.spawn(self._send, msg, answers):
            self.pending.add(msg)
            self.queued.add(msg)

    async def _send(self, msg: Message, answers: Settle) -> None:
        self.queued.discard(msg)
        if msg.has_responded:  # a stop gave it back before the copy started
            self.pending.discard(msg)
            return
        try:
            await self._copy(msg, answers)
        finally:
            self.pending.discard(msg)

    async def _copy(self, msg: Message, answers: Settle) -> None:
        producer = self.producer
        error = self.errors.pop(msg)
        try:
            if producer is None:
                raise NSQError("the dead-letter producer is not running")
            await self.letters.send(producer, msg, error)
        except REFUSED_FOR_GOOD as exc:
            if msg.has_responded:  # a stop gave it back meanwhile
                return
            self._refused(msg, exc)
            answers.discarded += 1
            answers.giving_up(msg, exc)
            if not msg.has_responded:
                answers.fin(msg, count=False)
            return
        except NSQError as exc:
            if error is not None:
                self.errors.failed(msg, error)  # for the next give-up
            if msg.has_responded:
                return
            options = self.state.options
            delay = retry_delay(msg, options.max_attempts, options.max_requeue_delay)
            sub: Subscription = sub_of(msg)  # type: ignore[assignment]
            if sub.ordered:
                # An ordered partition redelivers a REQ at once whatever its delay, and holds
                # the rest behind it anyway: hold the message for the delay (kept alive).
                delay = min(delay, sub.conn.features.msg_timeout / 2)
            log.warning(
                "could not publish message %s to dead-letter topic %s (%s): requeued, not "
                "finished; it comes back in %g s",
                id_text(msg),
                self.letters.topic,
                exc,
                delay,
            )
            if sub.ordered:
                answers.touch_now(msg)
                self.held.add(msg)
                try:
                    await anyio.sleep(delay)
                finally:
                    self.held.discard(msg)
                if msg.has_responded:  # a stop gave it back meanwhile
                    return
            # No backoff: the other messages are not at fault, they keep flowing.
            answers.req(msg, delay, False)
            return
        if msg.has_responded:  # a stop gave it back meanwhile: it comes again, copied again
            log.info(
                "message %s was copied to %s after the stop requeued it: it will be copied "
                "again when it comes back",
                id_text(msg),
                self.letters.topic,
            )
            return
        answers.discarded += 1
        answers.giving_up(msg, None)
        answers.fin(msg, count=False)

    def copying(self) -> list[Message]:
        """The messages whose copy is under way (started, not held between two tries)."""
        return [m for m in self.pending if m not in self.held and m not in self.queued]

    def _refused(self, msg: Message, exc: Exception) -> None:
        text = (
            f"dead-letter topic {self.letters.topic} refused message {id_text(msg)} of "
            f"{self.letters.source}/{self.letters.channel} for good ({exc}): giving up on it "
            "without a copy (on_giving_up is called with the reason), and finishing it"
        )
        log.error("%s", text)
        warn_unheard(log, "dead-letter-refused", text)
