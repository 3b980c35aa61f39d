"""Opening a connection against peers no real nsqd imitates: refused, silent, hanging up."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc
import pytest

from smartnsq import Connection, ConnectionConfig
from smartnsq.errors import ConnectFailed

pytestmark = pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])

Peer = Callable[[anyio.abc.SocketStream], Awaitable[None]]


@pytest.mark.anyio
async def test_a_refused_connection_names_the_nsqd(anyio_backend) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(ConnectFailed, match=f"cannot connect to nsqd {address}"):
        await Connection.open(address)


async def silent(stream: anyio.abc.SocketStream) -> None:
    pass  # answers nothing


async def hangs_up(stream: anyio.abc.SocketStream) -> None:
    await stream.receive()
    await stream.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("peer", "error"), [(silent, "timed out after 0.5s"), (hangs_up, "failed: EndOfStream")]
)
async def test_a_failed_handshake_names_the_nsqd_and_closes_the_link(
    anyio_backend, peer: Peer, error: str
) -> None:
    received: list[bytes] = []
    client_closed = anyio.Event()

    async def one(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await peer(stream)
            try:
                while True:
                    received.append(await stream.receive())
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                client_closed.set()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    address = f"127.0.0.1:{listener.extra(anyio.abc.SocketAttribute.local_port)}"
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, one)
        with pytest.raises(ConnectFailed, match=f"handshake with nsqd {address} {error}"):
            await Connection.open(address, ConnectionConfig(handshake_timeout=0.5))
        if peer is silent:
            assert b"".join(received).startswith(b"  V2")  # the magic went out
            with anyio.fail_after(5):
                await client_closed.wait()  # and the client closed its end
        tg.cancel_scope.cancel()
    await listener.aclose()
