"""A request's waiter on its own: the first outcome wins, a waiter given up on drops its
answer, on asyncio (eager future) and on any backend (event)."""

from __future__ import annotations

import asyncio

import pytest

from smartnsq.errors import NSQTimeout
from smartnsq.net.eager import EagerFuture
from smartnsq.net.waiters import EventWaiter, FutureWaiter, Waiter


def make(kind: str) -> Waiter:
    if kind == "future":
        return FutureWaiter(EagerFuture(loop=asyncio.get_running_loop()), True, 1.0, 2.0)
    return EventWaiter(True, 1.0, 2.0)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("kind", ["future", "event"])
async def test_an_expired_request_ignores_its_late_answer(anyio_backend, kind) -> None:
    waiter = make(kind)
    assert (waiter.publish, waiter.sent, waiter.deadline) == (True, 1.0, 2.0)
    waiter.set(b"", NSQTimeout("late"))  # the watchdog's expiry
    waiter.resolve(b"OK", None)  # the answer, when it finally comes
    waiter.wake()
    with pytest.raises(NSQTimeout, match="late"):
        await waiter.wait()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_the_answer_reaches_the_waiting_caller(anyio_backend) -> None:
    waiter = EventWaiter(False, 0.0, float("inf"))
    waiter.resolve(b"answer", None)
    waiter.wake()
    assert await waiter.wait() == b"answer"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_abandoned_future_waiter_drops_its_answer(anyio_backend) -> None:
    waiter = make("future")
    assert isinstance(waiter, FutureWaiter)
    waiter.abandon()  # the caller was cancelled
    waiter.set(b"OK", None)  # nothing raised, nothing kept
    assert waiter.future.cancelled()
