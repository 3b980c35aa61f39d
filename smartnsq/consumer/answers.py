"""Answers: what FIN, REQ and TOUCH mean to the consumer, for one message or a run of ids,
from the loop or from any thread (the counters, backoff, refusals); giving up on a message;
a handler's failure or result. The commands themselves are written by the delivery module
(:mod:`smartnsq.consumer.message`).
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from smartnsq._checks import check_requeue_delay
from smartnsq.consumer.deadletters import DeadLetterTopic
from smartnsq.consumer.message import (
    Message,
    id_text,
    owed,
    sub_of,
    write_fin,
    write_fins,
    write_req,
    write_reqs,
    write_touch,
    write_touches,
)
from smartnsq.consumer.pacing import Pacing
from smartnsq.consumer.state import State
from smartnsq.consumer.subscription import Subscription
from smartnsq.errors import FinFailed, NSQError, ReqFailed, ServerError
from smartnsq.net.inbox import Inbox, Kind
from smartnsq.notice import handler_failed

log = logging.getLogger("smartnsq.consumer")

Outcome = Literal["finish", "requeue", "back"]


class Answers:
    """The consumer's :class:`~smartnsq.consumer.message.Answerer` and its answer counters."""

    __slots__ = (
        "awaiting",
        "dead",
        "discarded",
        "finished",
        "inbox",
        "pacing",
        "refused",
        "requeued",
        "state",
        "uncounted",
    )

    def __init__(self, state: State, pacing: Pacing) -> None:
        self.state = state
        self.pacing = pacing
        self.finished = self.requeued = self.discarded = 0
        # FINs and REQs nsqd refused (E_FIN_FAILED, E_REQ_FAILED): counted as written first,
        # so taken back from finished / requeued.
        self.refused = 0
        # The ids (as nsqd's error text shows them) of recent FINs not counted as finished
        # (given-up messages): their refusal takes nothing back.
        self.uncounted: OrderedDict[str, None] = OrderedDict()
        # Where answers made on other threads are carried to the loop (set on start).
        self.inbox: Inbox | None = None
        # Messages whose handler returned an awaitable that is being awaited.
        self.awaiting: set[Message] = set()
        # Where given-up messages go first (dead_letter_topic), if anywhere.
        self.dead: DeadLetterTopic | None = None

    # -- from any thread (smartnsq.consumer.message.Answerer) ------------------------------

    def on_loop(self) -> bool:
        return threading.get_ident() == self.state.thread

    def finish(self, msg: Message) -> None:
        self._anywhere(self.fin, msg)

    def requeue(self, msg: Message, delay: float | None, backoff: bool) -> None:
        if delay is not None:
            delay = check_requeue_delay(delay)
        self._anywhere(self.req, msg, delay, backoff)

    def touch(self, msg: Message) -> None:
        if self.on_loop():
            self.touch_now(msg)
        else:  # the FIN may overtake it: then it has nothing left to do
            self._anywhere(self._touch_unless_answered, msg)

    def settle(self, msg: Message, outcome: Outcome) -> None:
        """For a sink's owner, done with ``msg``: ``"finish"`` FINs it unless answered by hand
        (or its auto response was disabled); ``"requeue"`` REQs it as a failed handler would;
        ``"back"`` gives it back for redelivery now, not counted as a failure."""
        self._anywhere(self._settle_now, msg, outcome)

    def settle_all(self, msgs: list[Message], outcome: Outcome) -> None:
        """:meth:`settle` for a run of messages, carried to the loop in one go."""
        self._anywhere(self._settle_all_now, msgs, outcome)

    def _settle_all_now(self, msgs: list[Message], outcome: Outcome) -> None:
        for msg in msgs:
            self._settle_now(msg, outcome)

    def _settle_now(self, msg: Message, outcome: Outcome) -> None:
        if msg.has_responded:
            return
        if outcome == "finish":
            if owed(msg):
                self.fin(msg)
        elif outcome == "requeue":
            self.req(msg, None, True)
        else:
            self.give_back(msg)

    def give_up_anywhere(self, msg: Message) -> None:
        """:meth:`give_up`, from any thread."""
        self._anywhere(self.give_up, msg)

    def _anywhere(self, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn`` now on the loop's thread, or carry it over there from another one."""
        if threading.get_ident() == self.state.thread:
            fn(*args)
            return
        inbox = self.inbox
        if inbox is None:
            raise NSQError("the consumer is not running")
        inbox.put((Kind.CALL, fn, args))

    def _touch_unless_answered(self, msg: Message) -> None:
        if not msg.has_responded:
            self.touch_now(msg)

    # -- one message, on the loop -----------------------------------------------------------------

    def fin(self, msg: Message, count: bool = True) -> None:
        if write_fin(msg):
            if count:
                self.finished += 1
            else:
                self.not_counted(msg)
        if count and self.pacing.backoff.level:
            self.pacing.result(success=True)

    def req(self, msg: Message, delay: float | None, backoff: bool) -> None:
        sub: Subscription = sub_of(msg)  # type: ignore[assignment]
        if sub.ordered:
            delay = 0  # an ordered channel ignores REQ delays: the message must come back now
        elif delay is None:
            options = self.state.options
            delay = min(options.requeue_delay * msg.attempts, options.max_requeue_delay)
        if write_req(msg, int(delay * 1000)):
            self.requeued += 1
        if backoff:
            self.pacing.failed(redelivery=msg.attempts > 1)

    def not_counted(self, msg: Message) -> None:
        """Remember that the FIN of ``msg`` was not counted as finished."""
        uncounted = self.uncounted
        for key in answer_keys(msg):
            uncounted[key] = None
        while len(uncounted) > UNCOUNTED:
            uncounted.popitem(last=False)

    def refused_by_nsqd(self, err: ServerError) -> None:
        """nsqd refused a FIN or REQ (the message was no longer in flight: it had timed out,
        say): it counts as refused, not as finished or requeued."""
        if isinstance(err, FinFailed):
            key = refused_key(err.description)
            if key in self.uncounted:
                del self.uncounted[key]  # a given-up message's: not counted as finished
            else:
                self.finished -= 1
        elif isinstance(err, ReqFailed):
            self.requeued -= 1
        else:
            return
        self.refused += 1

    def give_back(self, msg: Message) -> None:
        """REQ for redelivery now, not counted as a failure (stopping, or not started)."""
        self.req(msg, 0, False)

    def touch_now(self, msg: Message) -> None:
        write_touch(msg)

    # -- a run of ids of one subscription, on the loop (threads, raw sinks) ------------------------

    def finish_ids(self, sub: Subscription, ids: list[bytes]) -> None:
        """FIN ``ids`` (received on ``sub``) in one write."""
        n = len(ids)
        if write_fins(sub, ids):
            self.finished += n
        if self.pacing.backoff.level:
            for _ in range(n):
                self.pacing.result(success=True)

    def requeue_ids(self, sub: Subscription, ids: list[bytes]) -> None:
        """REQ ``ids`` (received on ``sub``) for redelivery now, in one write."""
        if write_reqs(sub, ids, 0):
            self.requeued += len(ids)

    def touch_ids(self, sub: Subscription, ids: list[bytes]) -> None:
        """TOUCH ``ids`` (received on ``sub``) in one write."""
        write_touches(sub, ids)

    # -- outcomes ---------------------------------------------------------------------------------

    def answer(self, msg: Message, value: Any) -> None:
        """What the handler's result ``value`` asks for (unless answered by hand)."""
        if owed(msg):
            if value is False:
                self.req(msg, None, True)
            else:
                self.fin(msg)

    def handler_returned(self, msg: Message, value: Any) -> None:
        """A handler thread's result: awaited first when it is awaitable."""
        if inspect.isawaitable(value):
            if self.state.tg is None:
                return
            self.awaiting.add(msg)
            self.state.spawn(self._await_result, msg, value)
        else:
            self.answer(msg, value)

    async def _await_result(self, msg: Message, awaitable: Awaitable[Any]) -> None:
        """Await what a plain function handler returned, then answer as for its result."""
        try:
            value = await awaitable
        except Exception as exc:
            self.handler_failed(msg, exc)
        else:
            self.handler_returned(msg, value)
        finally:
            self.awaiting.discard(msg)

    def handler_failed(self, msg: Message, exc: BaseException) -> None:
        log.warning(
            "handler failed for message %s (attempt %d): %r",
            id_text(msg),
            msg.attempts,
            exc,
            exc_info=exc,
        )
        handler_failed(log, f"message {id_text(msg)}, attempt {msg.attempts}", exc)
        if self.dead is not None:
            self.dead.errors.failed(msg, exc)
        if owed(msg):
            self.req(msg, None, True)

    def give_up(self, msg: Message) -> None:
        """Past ``max_attempts``: to the dead-letter topic first, if there is one; else
        ``on_giving_up`` (or a warning), then FIN."""
        if self.dead is not None:
            self.dead.give_up(msg, self)
            return
        self.discarded += 1
        options = self.state.options
        if options.on_giving_up is None:
            log.warning(
                "giving up on message %s after %d attempts (max_attempts=%d); finishing it",
                id_text(msg),
                msg.attempts,
                options.max_attempts,
            )
        else:
            self.giving_up(msg, None)
        if not msg.has_responded:
            self.fin(msg, count=False)

    def giving_up(self, msg: Message, reason: Exception | None) -> None:
        """Call ``on_giving_up`` with ``msg``, and ``reason`` when it takes a second argument."""
        options = self.state.options
        callback = options.on_giving_up
        if callback is not None:
            args = (msg, reason) if options.giving_up_reason else (msg,)
            self.state.call_back("on_giving_up", callback, *args)


UNCOUNTED = 1024  # given-up messages' FINs remembered for refusals that may follow


def answer_keys(msg: Message) -> tuple[str, ...]:
    """How nsqd's E_FIN_FAILED text may name ``msg``: classic nsqd by its 16 hex characters,
    the Youzan fork by its internal id in decimal or by its id's bytes as Go prints them
    (``[0 0 0 0 0 0 0 2 0 0 0 0 0 0 0 0]``)."""
    keys = [str(msg.internal_id), "[" + " ".join(map(str, msg.id)) + "]"]
    if msg.id.isascii():
        keys.append(msg.id.decode())
    return tuple(keys)


def refused_key(description: str) -> str:
    """The message an E_FIN_FAILED text names (``FIN <id> failed ...``), as answer_keys."""
    if not description.startswith("FIN "):
        return ""
    rest = description[4:]
    if rest.startswith("["):  # a Go byte list: spaces inside
        return rest[: rest.find("]") + 1]
    return rest.split(" ", 1)[0]
