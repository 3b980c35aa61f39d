"""Small fake servers for hostile behaviour no real nsqd shows (tests only)."""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.abc

from smartnsq.protocol.frames import FRAME_RESPONSE, encode_frame

Serve = Callable[[anyio.abc.SocketStream], Awaitable[None]]

IDENTIFY_OK = encode_frame(FRAME_RESPONSE, json.dumps({"max_rdy_count": 2500}).encode())
HEARTBEAT = encode_frame(FRAME_RESPONSE, b"_heartbeat_")


@asynccontextmanager
async def fake_server(serve: Serve) -> AsyncIterator[str]:
    """Run ``serve`` for every connection to a loopback port; yields ``host:port``."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def guarded(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                await serve(stream)
            except* (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # the client went away

    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, guarded)
        try:
            yield f"127.0.0.1:{port}"
        finally:
            tg.cancel_scope.cancel()


async def read_until_closed(stream: anyio.abc.SocketStream) -> None:
    while await stream.receive():
        pass


async def read_identify(stream: anyio.abc.SocketStream) -> None:
    """Read the magic and the whole IDENTIFY command: "  V2", "IDENTIFY\n", a 4-byte size,
    then that many bytes of JSON."""
    buf = b""
    while (at := buf.find(b"IDENTIFY\n")) < 0 or len(buf) < at + 13:
        buf += await stream.receive()
    (size,) = struct.unpack_from(">i", buf, at + 9)
    while len(buf) < at + 13 + size:
        buf += await stream.receive()


def identify_reply(reply: bytes) -> Serve:
    """A server that answers the IDENTIFY with ``reply`` (a response frame's payload)."""

    async def serve(stream: anyio.abc.SocketStream) -> None:
        await read_identify(stream)
        await stream.send(encode_frame(FRAME_RESPONSE, reply))
        await read_until_closed(stream)

    return serve


async def heartbeats_only(stream: anyio.abc.SocketStream) -> None:
    """Completes the handshake, then sends heartbeats and never answers a command."""
    await read_identify(stream)
    await stream.send(IDENTIFY_OK)
    async with anyio.create_task_group() as tg:

        async def beat() -> None:
            while True:
                await stream.send(HEARTBEAT)
                await anyio.sleep(0.2)

        tg.start_soon(beat)
        await read_until_closed(stream)
        tg.cancel_scope.cancel()


async def garbage(stream: anyio.abc.SocketStream) -> None:
    """Answers everything with bytes that are not NSQ."""
    await stream.receive()
    await stream.send(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n" * 4)
    await read_until_closed(stream)


def accept_identify(sock: socket.socket) -> bytes:
    """Blocking server side of the handshake: read the magic and the whole IDENTIFY, answer
    it; returns what the client sent after it."""
    data = b""
    while b"IDENTIFY\n" not in data or len(data) < data.index(b"IDENTIFY\n") + 13:
        data += sock.recv(4096)
    at = data.index(b"IDENTIFY\n") + 9
    (size,) = struct.unpack_from(">i", data, at)
    while len(data) < at + 4 + size:
        data += sock.recv(4096)
    sock.sendall(IDENTIFY_OK)
    return data[at + 4 + size :]
