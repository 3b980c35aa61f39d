"""The consumer's idle workers: woken one at a time, in order; a cancelled waiter is skipped;
on asyncio an eager wake from a transport callback runs the worker before it returns."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from smartnsq.idle import IdleWorkers


@pytest.mark.anyio
async def test_wakes_in_order_and_skips_cancelled_waiters() -> None:
    idle = IdleWorkers()
    woken: list[int] = []
    scopes: dict[int, anyio.CancelScope] = {}

    async def worker(n: int) -> None:
        with anyio.CancelScope() as scopes[n]:
            await idle.wait()
            woken.append(n)

    async with anyio.create_task_group() as tg:
        for n in range(3):
            tg.start_soon(worker, n)
            await anyio.wait_all_tasks_blocked()  # each waits before the next starts
        scopes[0].cancel()
        await anyio.wait_all_tasks_blocked()
        idle.wake_one()  # the first still waiting: 1
        await anyio.wait_all_tasks_blocked()
        assert woken == [1]
        idle.wake_all()
    assert woken == [1, 2]


def test_eager_wake_runs_the_worker_inside_the_callback() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        idle = IdleWorkers()
        woken: list[asyncio.Task[None] | None] = []

        async def worker() -> None:
            await idle.wait()
            woken.append(asyncio.current_task())  # runs as its own task

        task = asyncio.create_task(worker())
        await asyncio.sleep(0)
        seen: list[list[asyncio.Task[None] | None]] = []

        def callback(eager: bool) -> None:  # like a transport's data_received
            idle.wake_one(eager=eager)
            seen.append(list(woken))

        loop.call_soon(callback, True)
        await task
        assert seen == [[task]]  # already ran when wake_one returned

        task = asyncio.create_task(worker())
        await asyncio.sleep(0)
        woken.clear()
        loop.call_soon(callback, False)
        await task
        assert seen[1] == []  # not eager: on the loop's next pass
        assert woken == [task]

    asyncio.run(main())
