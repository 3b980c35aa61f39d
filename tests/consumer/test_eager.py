"""smartnsq.net.eager: its probe, and the public fallback when the probe fails or the eager
mechanisms are switched off (futures woken on the loop's next pass, no worker runs in a
callback), the consumer working the same either way."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from smartnsq import Consumer, Message, Producer
from smartnsq.net import eager
from smartnsq.net.idle import IdleWorkers
from tests.helpers import create_channel, unique, wait_until


@pytest.fixture
def eager_off() -> Iterator[None]:
    eager.force(False)
    yield
    assert eager.force(None)


def test_the_probe_passes_on_a_tested_python_and_can_be_switched_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert eager.force(None) and eager.enabled()
    monkeypatch.setenv("SMARTNSQ_EAGER", "0")
    assert not eager.force(None) and not eager.enabled()
    monkeypatch.delenv("SMARTNSQ_EAGER")
    monkeypatch.setattr(eager, "TESTED", ())  # a Python it was not tested on
    assert not eager.force(None)
    monkeypatch.undo()
    monkeypatch.delattr(asyncio.tasks, "_enter_task")  # a Python without the function
    assert not eager.force(None)
    monkeypatch.undo()
    assert eager.force(None)


def test_fallback_wakes_on_the_next_pass_and_runs_nothing_as_a_worker(eager_off: None) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        idle = IdleWorkers()
        woken: list[object] = []

        async def worker() -> None:
            await idle.wait()
            woken.append(asyncio.current_task())

        task = asyncio.create_task(worker())
        await asyncio.sleep(0)
        seen: list[list[object]] = []
        ran: list[bool] = []

        def callback() -> None:  # like a transport's data_received
            ran.append(idle.run_as_worker(lambda x: x, None))
            idle.wake_one(eager=True)
            seen.append(list(woken))

        loop.call_soon(callback)
        await task
        assert ran == [False]  # declined: nothing ran as the worker
        assert seen == [[]]  # not run inside the callback: a plain future's wake
        assert woken == [task]

        future = eager.EagerFuture(loop=loop)
        got: list[Any] = []

        async def waiter() -> None:
            got.append(await future)

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0)

        def resolve() -> None:
            future.resolve(b"OK", None)
            future.wake()
            seen.append(list(got))

        loop.call_soon(resolve)
        await task
        assert seen[1] == [] and got == [b"OK"]

    asyncio.run(main())


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("mode", ["eager", "fallback"])
async def test_the_consumer_works_on_either_path(
    classic_cluster: Any, anyio_backend: str, mode: str
) -> None:
    if mode == "fallback":
        eager.force(False)
    try:
        nsqd = classic_cluster.nsqd[0]
        topic = unique("eager")
        create_channel(nsqd.http, topic, "c")
        bodies = [b"%d" % i for i in range(200)]
        got: list[bytes] = []

        async def handle(message: Message) -> None:
            got.append(message.body)
            if len(got) % 7 == 0:
                await anyio.sleep(0)  # a handler that waits is taken over by its worker

        async with Producer([nsqd.tcp]) as producer:
            await producer.publish_many(topic, bodies)
            async with Consumer(
                topic, "c", handle, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=50
            ) as c:
                await wait_until(lambda: c.stats().finished == 200, 20, "all finished")
                for i in range(20):  # one at a time: publish round trips on the eager path
                    await producer.publish(topic, b"x%d" % i)
                await wait_until(lambda: c.stats().finished == 220, 20, "the rest finished")
        assert sorted(got[:200]) == sorted(bodies)
        assert eager.enabled() == (mode == "eager")
    finally:
        assert eager.force(None)
