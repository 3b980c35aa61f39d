"""The consumer's idle workers: woken one at a time, in order; a cancelled waiter is skipped;
on asyncio an eager wake from a transport callback runs the worker before it returns, and a
worker's handling can run in the callback as that worker."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Iterator

import anyio
import pytest

from smartnsq.net import eager
from smartnsq.net.idle import IdleWorkers


@pytest.fixture(autouse=True)
def eager_on() -> Iterator[None]:
    """These tests are of the eager path (tests/consumer/test_eager.py: the fallback)."""
    assert eager.force(None), "the eager probe fails on this Python"
    yield


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


def test_run_as_worker_runs_in_the_worker_task_and_context() -> None:
    """What a worker would run after a wake, run in the callback instead: as the longest
    waiting worker's task (anyio's cancel scopes need one) and in its context; a job it
    returns wakes that worker with it, and the worker does the rest as itself."""
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="none")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        idle = IdleWorkers()
        ran: list[tuple[object, str, str]] = []
        jobs: dict[str, object] = {}
        tasks: dict[str, asyncio.Task[None]] = {}

        async def worker(name: str) -> None:
            var.set(name)
            jobs[name] = await idle.wait()
            ran.append(("after", asyncio.current_task(), var.get()))

        def handle(job: str | None) -> str | None:
            with anyio.fail_after(1):  # a cancel scope needs a current task
                ran.append((asyncio.current_task(), var.get(), "in a scope"))
            return job

        for name in ("first", "second"):
            tasks[name] = asyncio.create_task(worker(name))
            await asyncio.sleep(0)
        done: list[bool] = []
        loop.call_soon(lambda: done.append(idle.run_as_worker(handle, None)))
        await asyncio.sleep(0)
        # Ran as the first worker, which still waits (nothing to hand it).
        assert done == [True] and ran == [(tasks["first"], "first", "in a scope")]
        assert len(idle) == 2 and not tasks["first"].done()

        loop.call_soon(lambda: done.append(idle.run_as_worker(handle, "job")))
        await tasks["first"]
        assert done == [True, True] and jobs == {"first": "job"} and len(idle) == 1
        assert ran[1:] == [
            (tasks["first"], "first", "in a scope"),
            ("after", tasks["first"], "first"),
        ]

        # From inside a task (no transport callback) it runs nothing.
        assert not idle.run_as_worker(handle, "job") and len(ran) == 3
        tasks["second"].cancel()
        await asyncio.sleep(0)
        assert not idle.run_as_worker(handle, "job")  # only a cancelled waiter

    asyncio.run(main())


def test_run_as_worker_is_asyncio_only() -> None:
    async def main() -> None:
        idle = IdleWorkers()
        async with anyio.create_task_group() as tg:
            tg.start_soon(idle.wait)
            await anyio.wait_all_tasks_blocked()
            assert not idle.run_as_worker(lambda x: x, None)
            idle.wake_all()

    anyio.run(main, backend="trio")
