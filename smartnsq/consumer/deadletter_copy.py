"""Dead letters: a message the consumer gives up on is published to a topic of its own before
the original is finished, so that nothing is lost and it can be replayed later.

The copy keeps the body. On a Youzan ext topic it also keeps the original's ext headers and
trace id and adds what happened (:data:`FACTS`); topics without headers (classic nsqd, Youzan
topics without ext) cannot carry those facts, so they are logged at WARNING instead, once per
message.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

from smartnsq.consumer.message import Message, id_text
from smartnsq.protocol.compress import COMPRESS_KEY, SIZE_KEY

__all__ = ["FACTS", "DeadLetters", "LastErrors", "error_text", "facts"]

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
