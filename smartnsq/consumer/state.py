"""What the parts of one consumer share: its options, its subscriptions, whether it stops,
the task group its background work runs in, and the thread that owns it."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import anyio.abc

from smartnsq._checks import FORKS
from smartnsq.consumer.options import Options
from smartnsq.consumer.subscription import Subscription, Target

log = logging.getLogger("smartnsq.consumer")


class State:
    __slots__ = (
        "defer",
        "forks",
        "max_in_flight",
        "options",
        "received",
        "stopping",
        "subs",
        "tg",
        "thread",
    )

    def __init__(self, options: Options) -> None:
        self.options = options
        self.max_in_flight = options.max_in_flight
        self.subs: dict[Target, Subscription] = {}  # subscribed connections
        self.stopping = False
        self.tg: anyio.abc.TaskGroup | None = None
        # The thread whose event loop runs it (and the fork generation), set on start: the
        # owner checks, and whether an answer must be carried over from another thread.
        self.thread: int | None = None
        self.forks = FORKS[0]
        self.received = 0
        # Has a task of the consumer call a function soon (set on start): spawn() uses it
        # when called outside any task, where anyio cannot start one.
        self.defer: Callable[[Callable[[], None]], None] | None = None

    def usable(self) -> list[Subscription]:
        return [s for s in self.subs.values() if s.conn.usable]

    def spawn(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> bool:
        """Run ``fn(*args)`` in the background while the consumer runs (else not at all:
        False)."""
        if self.tg is None:
            return False
        if self.defer is not None and _outside_task():  # a loop callback
            self.defer(lambda: self._start_later(fn, args))
            return True
        self.tg.start_soon(fn, *args)
        return True

    def _start_later(self, fn: Callable[..., Coroutine[Any, Any, Any]], args: Any) -> None:
        if self.tg is not None and not self.stopping:
            self.tg.start_soon(fn, *args)

    def call_back(self, what: str, fn: Callable[..., Any], *args: Any) -> None:
        """Call a user's callback: its exceptions are logged; an awaitable it returns is
        awaited in the background (its failure logged too)."""
        try:
            result = fn(*args)
            if inspect.isawaitable(result):
                self.spawn(_await, what, result)
        except Exception:
            log.exception("%s callback failed", what)


async def _await(what: str, awaitable: Awaitable[Any]) -> None:
    try:
        await awaitable
    except Exception:
        log.exception("%s callback failed", what)


def _outside_task() -> bool:
    try:
        return asyncio.current_task() is None
    except RuntimeError:  # not asyncio: trio starts tasks from its callbacks too
        return False
