"""How a request waits for nsqd's answer, one waiter per request.

A connection queues a waiter per request and resolves the oldest with each response or error
frame (answers come in request order). Two kinds: an :class:`EventWaiter` on any anyio
backend, and on asyncio (uvloop included) a :class:`FutureWaiter` whose eager future resumes
the waiting task right where the answer is read. :func:`keep_polling` keeps the loop polling
its sockets while a lone request's answer is due (see ``smartnsq.net.busy_poll``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

import anyio

from smartnsq.net.busy_poll import cpu_yield
from smartnsq.net.eager import EagerFuture

__all__ = ["EventWaiter", "FutureWaiter", "Waiter", "keep_polling"]


class EventWaiter:
    """Waits for one answer on any anyio backend."""

    __slots__ = ("deadline", "error", "event", "publish", "result", "sent")

    def __init__(self, publish: bool, sent: float, deadline: float) -> None:
        self.event = anyio.Event()
        self.result = b""
        self.error: BaseException | None = None
        self.publish = publish
        self.sent = sent
        self.deadline = deadline

    def set(self, result: bytes, error: BaseException | None) -> None:
        if self.event.is_set():  # already expired
            return
        self.result = result
        self.error = error
        self.event.set()

    resolve = set

    def wake(self) -> None:
        pass

    def abandon(self) -> None:
        """Nobody waits any more: the answer, when it comes, is dropped."""
        self.event.set()

    async def wait(self) -> bytes:
        await self.event.wait()
        if self.error is not None:
            raise self.error
        return self.result


class FutureWaiter:
    """Waits for one answer on asyncio (uvloop included), with an eager future."""

    __slots__ = ("deadline", "future", "publish", "sent")

    def __init__(self, future: EagerFuture, publish: bool, sent: float, deadline: float) -> None:
        self.future = future
        self.publish = publish
        self.sent = sent
        self.deadline = deadline

    def set(self, result: bytes, error: BaseException | None) -> None:
        self.future.resolve(result, error)
        self.future.wake()

    def resolve(self, result: bytes, error: BaseException | None) -> None:
        self.future.resolve(result, error)

    def wake(self) -> None:
        self.future.wake()

    def abandon(self) -> None:
        """Nobody waits any more: the answer, when it comes, is dropped (never raised)."""
        self.future.cancel()

    def wait(self) -> Awaitable[bytes]:
        return self.future  # awaited directly: no coroutine frame in between


Waiter = EventWaiter | FutureWaiter


def keep_polling(loop: Any, future: asyncio.Future[bytes], until: float) -> None:
    """Until ``future`` is done or the time is up: with a callback always ready, each pass
    of the loop polls its sockets without sleeping, and gives the CPU away."""
    if future.done():
        return
    if time.perf_counter() < until:
        cpu_yield()
        loop.call_soon(keep_polling, loop, future, until)
