"""Workers start lazily (no sockets): as many tasks as messages wait for a handler, up to
``concurrency``, never ``concurrency`` up front (100 consumers used to start 10,000 tasks)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from smartnsq.consumer.message import Message
from tests.consumer.test_parts import FakeConn, Parts, read

pytestmark = pytest.mark.anyio


def mid(i: int) -> bytes:
    return b"%016d" % i


@asynccontextmanager
async def running(p: Parts) -> AsyncIterator[None]:
    async with anyio.create_task_group() as tg:
        tg.start_soon(p.workers.run)
        await wait_all_tasks_blocked()
        yield
        p.state.stopping = True
        p.workers.cancel()


def fins(conn: FakeConn) -> int:
    return sum(w.count(b"FIN ") for w in conn.written)


async def test_no_message_no_worker_and_a_handler_that_never_waits_needs_one() -> None:
    handled: list[bytes] = []

    async def handle(message: Message) -> None:
        handled.append(message.body)

    p = Parts(handle, max_in_flight=200)  # concurrency 100 by default
    sub, conn = p.subscribe()
    sub.set_rdy(200)
    async with running(p):
        assert len(p.workers.slots) == 0
        for n in range(3):  # several reads, each queued before the worker runs
            conn.on_messages(*read(*[(mid(10 * n + i), 1, b"x") for i in range(5)]))
        await wait_all_tasks_blocked()
        assert len(handled) == 15 and fins(conn) == 15
        assert len(p.workers.slots) == 1


@pytest.mark.parametrize("waiting", [1, 3, 10, 25])
async def test_workers_started_are_the_messages_waiting_up_to_concurrency(waiting: int) -> None:
    release = anyio.Event()
    entered: list[bytes] = []

    async def handle(message: Message) -> None:
        entered.append(message.id)
        await release.wait()

    p = Parts(handle, max_in_flight=100, concurrency=10)
    sub, conn = p.subscribe()
    sub.set_rdy(100)
    async with running(p):
        conn.on_messages(*read(*[(mid(i), 1, b"x") for i in range(waiting)]))
        await wait_all_tasks_blocked()
        assert len(p.workers.slots) == min(waiting, 10)
        assert len(entered) == min(waiting, 10) and len(p.workers.queue) == max(0, waiting - 10)
        release.set()
        await wait_all_tasks_blocked()
        assert fins(conn) == waiting and not p.workers.queue
        # Idle workers stay: the next burst of the same size starts none.
        assert len(p.workers.slots) == min(waiting, 10)


async def test_a_read_while_a_worker_is_on_its_way_starts_no_other() -> None:
    # The second read comes before the worker started for the first one runs: that
    # worker takes both (its handler never waits), so one worker is enough.
    async def handle(message: Message) -> None:
        pass

    p = Parts(handle, max_in_flight=100, concurrency=10)
    (s1, c1), (s2, c2) = p.subscribe("n1:4150"), p.subscribe("n2:4150")
    s1.set_rdy(50)
    s2.set_rdy(50)
    async with running(p):
        c1.on_messages(*read((mid(1), 1, b"a")))
        c2.on_messages(*read((mid(2), 1, b"b")))
        await wait_all_tasks_blocked()
        c1.on_messages(*read((mid(3), 1, b"c")))  # now an idle worker is woken
        await wait_all_tasks_blocked()
        assert fins(c1) + fins(c2) == 3 and len(p.workers.slots) == 1


async def test_messages_queued_before_the_start_get_a_worker() -> None:
    handled: list[Any] = []

    async def handle(message: Message) -> None:
        handled.append(message.body)

    p = Parts(handle)
    sub, conn = p.subscribe()
    sub.set_rdy(10)
    conn.on_messages(*read((mid(1), 1, b"a"), (mid(2), 1, b"b")))
    async with running(p):
        await wait_all_tasks_blocked()
        assert handled == [b"a", b"b"] and len(p.workers.slots) == 1


def test_a_read_in_a_transport_callback_under_asyncio_run_gets_a_worker() -> None:
    # Reads come in the transport's callbacks, outside any task: a worker started right
    # there under plain asyncio.run() was never run (found by bench.consume).
    async def main() -> tuple[int, int]:
        handled: list[bytes] = []
        both = anyio.Event()

        async def handle(message: Message) -> None:
            handled.append(message.body)
            if len(handled) == 2:
                both.set()

        p = Parts(handle)
        sub, conn = p.subscribe()
        sub.set_rdy(10)
        async with anyio.create_task_group() as tg:
            tg.start_soon(p.workers.run)
            await wait_all_tasks_blocked()
            loop = asyncio.get_running_loop()
            loop.call_soon(conn.on_messages, *read((mid(1), 1, b"a"), (mid(2), 1, b"b")))
            with anyio.fail_after(5):
                await both.wait()
            p.state.stopping = True
            p.workers.cancel()
        return len(handled), len(p.workers.slots)

    assert asyncio.run(main()) == (2, 1)
