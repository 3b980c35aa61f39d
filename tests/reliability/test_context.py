"""Clients used outside the context they belong to: another thread's event loop, a forked
child, and an AUTH secret about to cross an unencrypted connection."""

from __future__ import annotations

import os
from typing import Any

import anyio
import anyio.abc
import pytest

from smartnsq import Consumer, Producer, _checks
from smartnsq.errors import (
    NSQError,
    UsedAfterFork,
    WrongEventLoop,
)
from tests.helpers import topic_stats, unique, wait_until

pytestmark = [pytest.mark.reliability, pytest.mark.anyio]


def _in_thread_loop(backend: str, fn: Any) -> BaseException | None:
    """Run async ``fn`` with ``anyio.run`` (a new event loop) in the calling thread."""
    try:
        anyio.run(fn, backend=backend)
    except BaseException as exc:  # reported to the test thread
        return exc
    return None


# -- another thread ------------------------------------------------------------------------------


@pytest.mark.integration
async def test_producer_used_from_another_threads_loop(
    classic_cluster: Any, anyio_backend: str
) -> None:
    nsqd = classic_cluster.nsqd[0]
    topic = unique("thread")
    async with Producer([nsqd.tcp]) as producer:
        await producer.publish(topic, b"own loop")

        async def publish() -> None:
            await producer.publish(topic, b"foreign loop")

        async def publish_many() -> None:
            await producer.publish_many(topic, [b"foreign", b"loop"])

        for fn in (publish, publish_many):
            with anyio.fail_after(10):  # it used to hang the thread on trio
                err = await anyio.to_thread.run_sync(
                    _in_thread_loop, anyio_backend, fn, abandon_on_cancel=True
                )
            assert isinstance(err, WrongEventLoop), repr(err)
            assert "one Producer per thread" in str(err)
        await producer.publish(topic, b"own loop again")  # still fine in its own loop
    stats = topic_stats(nsqd.http, topic)
    assert stats is not None and stats["message_count"] == 2


@pytest.mark.integration
async def test_consumer_used_from_another_thread(classic_cluster: Any, anyio_backend: str) -> None:
    nsqd = classic_cluster.nsqd[0]
    topic = unique("thread_c")
    async with Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp]) as consumer:
        await wait_until(lambda: consumer.stats().connections, what="subscription")
        with anyio.fail_after(10):
            with pytest.raises(WrongEventLoop, match="one Consumer per thread"):
                await anyio.to_thread.run_sync(consumer.set_max_in_flight, 5)
        assert consumer.max_in_flight == 1

        async def pull() -> None:
            async for _ in consumer:
                break

        async def stop() -> None:
            await consumer.stop()

        for fn in (pull, stop):
            with anyio.fail_after(10):
                err = await anyio.to_thread.run_sync(
                    _in_thread_loop, anyio_backend, fn, abandon_on_cancel=True
                )
            assert isinstance(err, WrongEventLoop), repr(err)


# -- after fork() ----------------------------------------------------------------------------------


def _first_step_in_child(make: Any) -> tuple[int, str]:
    """Fork; in the child, run the first step of the coroutine ``make()`` returns (the
    argument checks happen before its first suspension) and report through a pipe.

    The child never runs an event loop: its parent's loop state is not its own.
    Exit code 0: UsedAfterFork; 2: another exception; 3: the call went on to wait for an
    answer (it had sent its command).
    """
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code, text = 1, ""
        try:
            os.close(read)
            try:
                make().send(None)
            except UsedAfterFork as exc:
                code, text = 0, str(exc)
            except BaseException as exc:
                code, text = 2, repr(exc)
            else:
                code, text = 3, "suspended after sending"
            os.write(write, text.encode())
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        text = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), text


@pytest.mark.integration
async def test_producer_used_after_fork(classic_cluster: Any, anyio_backend: str) -> None:
    nsqd = classic_cluster.nsqd[0]
    topic = unique("fork")
    async with Producer([nsqd.tcp]) as producer:
        await producer.publish(topic, b"parent")
        for make in (
            lambda: producer.publish(topic, b"child"),
            lambda: producer.publish_many(topic, [b"child", b"child"]),
        ):
            code, text = await anyio.to_thread.run_sync(_first_step_in_child, make)
            assert code == 0, text
            assert "create a new Producer in the child" in text
        await producer.publish(topic, b"parent again")
    stats = topic_stats(nsqd.http, topic)
    assert stats is not None and stats["message_count"] == 2


@pytest.mark.integration
async def test_consumer_used_after_fork(classic_cluster: Any, anyio_backend: str) -> None:
    nsqd = classic_cluster.nsqd[0]
    topic = unique("fork_c")
    async with Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp]) as consumer:
        await wait_until(lambda: consumer.stats().connections, what="subscription")
        code, text = await anyio.to_thread.run_sync(
            _first_step_in_child, lambda: consumer.__aiter__().__anext__()
        )
        assert code == 0, text
        assert "create a new Consumer in the child" in text


async def test_a_client_never_started_keeps_its_own_error(anyio_backend: str) -> None:
    """Not started: the owner check steps aside for the clearer 'use async with' error."""
    producer = Producer(["127.0.0.1:4150"])
    _checks.FORKS[0] += 1  # as in a forked child
    try:
        with pytest.raises(NSQError, match="inside 'async with"):
            await producer.publish("t", b"x")
    finally:
        _checks.FORKS[0] -= 1
