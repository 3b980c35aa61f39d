"""Wakeup: one task's wake-up call, set from anywhere on the loop's thread."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from smartnsq.net.wakeup import Wakeup

pytestmark = pytest.mark.anyio


async def test_a_set_before_the_wait_is_kept_and_the_wait_clears_it(anyio_backend: str) -> None:
    w = Wakeup()
    w.set()
    assert w.is_set()
    with anyio.fail_after(1):
        await w.wait()
    assert not w.is_set()
    with anyio.move_on_after(0.05) as scope:  # cleared: the next wait waits
        await w.wait()
    assert scope.cancelled_caught


async def test_a_set_from_a_loop_callback_wakes_the_waiting_task(anyio_backend: str) -> None:
    w = Wakeup()
    woken: list[float] = []

    async def waiter() -> None:
        await w.wait()
        woken.append(anyio.current_time())

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.sleep(0.01)  # the waiter is parked
        assert not woken
        if anyio_backend == "asyncio":  # outside any task, as a transport callback is
            asyncio.get_running_loop().call_soon(w.set)
        else:
            import trio

            trio.lowlevel.current_trio_token().run_sync_soon(w.set)
        with anyio.fail_after(1):
            while not woken:
                await anyio.sleep(0.001)
    assert not w.is_set()


async def test_a_cancelled_wait_loses_no_later_set(anyio_backend: str) -> None:
    w = Wakeup()
    with anyio.move_on_after(0.01):
        await w.wait()
    w.set()  # nobody waits now: kept for the next wait
    with anyio.fail_after(1):
        await w.wait()


async def test_clear_forgets_a_set(anyio_backend: str) -> None:
    w = Wakeup()
    w.set()
    w.clear()
    with anyio.move_on_after(0.05) as scope:
        await w.wait()
    assert scope.cancelled_caught
