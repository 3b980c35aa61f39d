"""Clients used outside the context they belong to: another thread's event loop, a forked
child, and an AUTH secret about to cross an unencrypted connection."""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import anyio
import anyio.abc
import pytest

from smartnsq import Connection, ConnectionConfig, Consumer, Producer, _checks
from smartnsq.errors import (
    ConnectFailed,
    InsecureAuth,
    InsecureAuthWarning,
    InvalidType,
    NSQError,
    UsedAfterFork,
    WrongEventLoop,
)
from smartnsq.protocol import handshake
from smartnsq.protocol.frames import FRAME_RESPONSE, encode_frame
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


# -- AUTH without TLS ------------------------------------------------------------------------------

SECRET = "s3cret-token"


def _causes(exc: BaseException | None) -> list[BaseException]:
    """``exc`` and its chain of causes (Connection.open wraps handshake failures)."""
    chain = []
    while exc is not None:
        chain.append(exc)
        exc = exc.__cause__
    return chain


class _AuthNsqd:
    """A minimal nsqd that demands AUTH (without offering TLS) and records every byte."""

    def __init__(self) -> None:
        self.received = bytearray()

    async def handle(self, stream: anyio.abc.ByteStream) -> None:
        buf = bytearray()

        async def more() -> None:
            chunk = await stream.receive()
            self.received += chunk
            buf.extend(chunk)

        async def need(n: int) -> bytes:
            while len(buf) < n:
                await more()
            out = bytes(buf[:n])
            del buf[:n]
            return out

        async def line() -> bytes:
            while b"\n" not in buf:
                await more()
            i = buf.index(b"\n")
            out = bytes(buf[:i])
            del buf[: i + 1]
            return out

        async def body() -> bytes:
            size = int.from_bytes(await need(4), "big")
            return await need(size)

        async with stream:
            try:
                await need(4)  # magic
                await line()  # IDENTIFY
                await body()
                reply = {"version": "1.3.0", "max_rdy_count": 2500, "auth_required": True}
                await stream.send(encode_frame(FRAME_RESPONSE, json.dumps(reply).encode()))
                while True:
                    command = await line()
                    if command == b"AUTH" or command.startswith(b"PUB "):
                        await body()
                        answer = b'{"identity":"tester","permission_count":1}'
                        await stream.send(
                            encode_frame(FRAME_RESPONSE, answer if command == b"AUTH" else b"OK")
                        )
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass


@pytest.fixture
async def auth_nsqd() -> Any:
    server = _AuthNsqd()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, server.handle)
        yield server, f"127.0.0.1:{port}"
        tg.cancel_scope.cancel()


async def test_auth_over_plaintext_false_refuses_before_the_secret_is_written(
    auth_nsqd: Any, anyio_backend: str
) -> None:
    server, address = auth_nsqd
    config = ConnectionConfig(auth_secret=SECRET, auth_over_plaintext=False)
    with anyio.fail_after(10), pytest.raises(ConnectFailed, match="secret was not sent") as info:
        await Connection.open(address, config)
    assert any(isinstance(e, InsecureAuth) for e in _causes(info.value))
    assert SECRET not in str(info.value)
    assert b"IDENTIFY" in server.received  # the handshake did reach the server ...
    assert b"AUTH" not in server.received  # ... and stopped before AUTH
    assert SECRET.encode() not in server.received

    # The Producer's start refuses (not a publish's retries): settings cannot improve.
    with anyio.fail_after(10), pytest.raises(InsecureAuth):
        async with Producer([address], auth_secret=SECRET, auth_over_plaintext=False):
            pytest.fail("entered")
    assert SECRET.encode() not in server.received


async def test_auth_without_tls_warns_once_per_process(
    auth_nsqd: Any, anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, address = auth_nsqd
    monkeypatch.setattr(handshake, "_warned_plaintext_auth", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            conn = await Connection.open(address, ConnectionConfig(auth_secret=SECRET))
            assert conn.auth == {"identity": "tester", "permission_count": 1}
            await conn.close(timeout=0)
        async with Producer([address], auth_secret=SECRET) as p:
            await p.publish("t", b"x")
    insecure = [w for w in caught if issubclass(w.category, InsecureAuthWarning)]
    assert len(insecure) == 1, [str(w.message) for w in caught]
    assert "without TLS" in str(insecure[0].message)
    assert SECRET not in str(insecure[0].message)
    assert server.received.count(SECRET.encode()) == 4  # the default still sends it


def test_the_secret_stays_out_of_reprs_and_errors() -> None:
    config = ConnectionConfig(auth_secret=SECRET)
    assert SECRET not in repr(config)
    assert SECRET not in repr(ConnectionConfig(auth_secret=SECRET.encode()))
    producer = Producer(["127.0.0.1:4150"], auth_secret=SECRET)
    assert SECRET not in repr(producer) and SECRET not in repr(vars(producer))
    consumer = Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], auth_secret=SECRET)
    assert SECRET not in repr(consumer)
    with pytest.raises(InvalidType) as info:
        ConnectionConfig(auth_secret=12345678)  # type: ignore[arg-type]
    assert "12345678" not in str(info.value)
