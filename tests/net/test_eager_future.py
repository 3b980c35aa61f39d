"""The connection's eager future: an answer woken from a transport callback resumes the
waiting task inside that callback; everything else behaves like a plain future."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Iterator

import anyio
import pytest

from smartnsq.net import eager
from smartnsq.net.eager import EagerFuture as _EagerFuture

pytestmark = pytest.mark.parametrize("loop", ["asyncio", "uvloop"])

var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")


@pytest.fixture(autouse=True)
def eager_on() -> Iterator[None]:
    """These tests are of the eager path (tests/consumer/test_eager.py: the fallback)."""
    assert eager.force(None), "the eager probe fails on this Python"
    yield


def run(loop: str, main) -> None:  # type: ignore[no-untyped-def]
    if loop == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


def test_resolved_outside_a_task_resumes_the_waiter_at_once(loop: str) -> None:
    async def main() -> None:
        fut = _EagerFuture(loop=asyncio.get_running_loop())
        seen: list[tuple[bytes, str]] = []

        async def waiter() -> None:
            var.set("waiter's")
            seen.append((await fut, var.get()))

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0)  # the task is now waiting on fut
        observed: list[list[tuple[bytes, str]]] = []

        def transport_callback() -> None:  # runs outside any task, like data_received
            fut.resolve(b"OK", None)
            assert seen == []  # resolving alone does not resume it
            fut.wake()
            observed.append(list(seen))

        asyncio.get_running_loop().call_soon(transport_callback)
        await task
        assert observed == [[(b"OK", "waiter's")]]  # resumed inside the callback, own context

    run(loop, main)


def test_resolved_inside_a_task_resumes_on_the_next_pass(loop: str) -> None:
    async def main() -> None:
        fut = _EagerFuture(loop=asyncio.get_running_loop())
        seen: list[bytes] = []

        async def waiter() -> None:
            seen.append(await fut)

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0)
        fut.resolve(b"OK", None)
        fut.wake()  # from this task: no nested task step
        assert seen == []
        await task
        assert seen == [b"OK"]

    run(loop, main)


def test_errors_are_raised_in_the_waiter(loop: str) -> None:
    async def main() -> None:
        fut = _EagerFuture(loop=asyncio.get_running_loop())
        task = asyncio.create_task(_await(fut))
        await asyncio.sleep(0)
        asyncio.get_running_loop().call_soon(answer, fut, b"", ValueError("E_BAD_TOPIC"))
        with pytest.raises(ValueError, match="E_BAD_TOPIC"):
            await task

    run(loop, main)


def test_cancelling_the_waiter_wakes_it(loop: str) -> None:
    async def main() -> None:
        fut = _EagerFuture(loop=asyncio.get_running_loop())
        task = asyncio.create_task(_await(fut))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)
        assert fut.cancelled()
        answer(fut, b"late", None)  # a late answer is ignored

    run(loop, main)


def test_anyio_timeouts_cancel_the_wait(loop: str) -> None:
    async def main() -> None:
        fut = _EagerFuture(loop=asyncio.get_running_loop())
        with anyio.move_on_after(0.05) as scope:
            await fut
        assert scope.cancelled_caught
        assert fut.cancelled()

    run(loop, main)


def test_other_callbacks_are_scheduled_normally(loop: str) -> None:
    async def main() -> None:
        fut = _EagerFuture(loop=asyncio.get_running_loop())
        calls: list[bytes] = []
        fut.add_done_callback(lambda f: calls.append(f.result()))  # the first one: the waker
        fut.add_done_callback(lambda f: calls.append(f.result() + b"!"))
        asyncio.get_running_loop().call_soon(answer, fut, b"OK", None)
        for _ in range(100):
            if len(calls) == 2:
                break
            await asyncio.sleep(0)
        assert sorted(calls) == [b"OK", b"OK!"]

    run(loop, main)


def answer(fut: _EagerFuture, result: bytes, error: BaseException | None) -> None:
    fut.resolve(result, error)
    fut.wake()


async def _await(fut: asyncio.Future[bytes]) -> bytes:
    return await fut
