"""Reference publishers with no client library (stdlib only), for ``bench.floor``.

Each sends the same pre-built MPUB of ``--batch`` x 100-byte bodies, one batch in flight, and
skips everything a client library has to do: no IDENTIFY, no checks on the bodies, no
encoding per call, no matching of answers to requests, no timeouts. What is left is the cost
of the round trip on that kind of event loop. ``--variant`` picks it:

  blocking   a blocking socket: send, then recv until the answer is complete
  callback   an asyncio Protocol that writes the next MPUB from data_received
  future     an asyncio Protocol whose data_received resolves a future that a task
             awaits before it writes the next MPUB (the usual shape of an asyncio client)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import struct
import sys
from collections.abc import Callable
from typing import cast

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _driver as d

OK_FRAME = struct.pack(">II", 6, 0) + b"OK"


def mpub(topic: str, bodies: list[bytes]) -> bytes:
    payload = struct.pack(">I", len(bodies)) + b"".join(
        struct.pack(">I", len(b)) + b for b in bodies
    )
    return b"MPUB " + topic.encode() + b"\n" + struct.pack(">I", len(payload)) + payload


def pub(topic: str, body: bytes) -> bytes:
    return b"PUB " + topic.encode() + b"\n" + struct.pack(">I", len(body)) + body


def check(answer: bytes) -> None:
    if answer != OK_FRAME:
        raise RuntimeError(f"nsqd answered {answer!r}")


def blocking(a: argparse.Namespace, cmd: bytes, batches: int) -> tuple[int, float, float]:
    s = socket.create_connection((a.host, a.port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def ask(data: bytes) -> None:
        s.sendall(data)
        answer = b""
        while len(answer) < len(OK_FRAME):
            chunk = s.recv(64 * 1024)
            if not chunk:
                raise RuntimeError("nsqd closed the connection")
            answer += chunk
        check(answer)

    s.sendall(b"  V2")
    ask(pub(a.topic, d.MSG))  # warm-up
    t0 = d.start()
    deadline = t0 + a.seconds
    n = 0
    while n < batches and d.now() < deadline:
        ask(cmd)
        n += 1
    t1 = d.now()
    s.close()
    return n, t0, t1


class Reference(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.buf = b""
        self.answer: asyncio.Future[bytes] = loop.create_future()
        # callback variant: called with each complete answer
        self.on_answer: Callable[[bytes], None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= len(OK_FRAME):
            answer, self.buf = self.buf[: len(OK_FRAME)], self.buf[len(OK_FRAME) :]
            if self.on_answer is not None:
                self.on_answer(answer)
            else:
                self.answer.set_result(answer)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.answer.done():
            self.answer.set_exception(exc or RuntimeError("nsqd closed the connection"))

    async def ask(self, data: bytes) -> None:
        self.answer = self.loop.create_future()
        self.transport.write(data)
        check(await self.answer)


async def on_asyncio(a: argparse.Namespace, cmd: bytes, batches: int) -> tuple[int, float, float]:
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_connection(lambda: Reference(loop), a.host, a.port)
    proto.transport.write(b"  V2")
    await proto.ask(pub(a.topic, d.MSG))  # warm-up
    t0 = d.start()
    deadline = t0 + a.seconds
    n = 0
    if a.variant == "future":
        while n < batches and d.now() < deadline:
            await proto.ask(cmd)
            n += 1
    else:
        done = loop.create_future()

        def on_answer(answer: bytes) -> None:
            nonlocal n
            check(answer)
            n += 1
            if n < batches and d.now() < deadline:
                proto.transport.write(cmd)
            elif not done.done():
                done.set_result(None)

        proto.on_answer = on_answer
        proto.transport.write(cmd)
        await done
    t1 = d.now()
    proto.transport.close()
    return n, t0, t1


def main() -> None:
    a = d.parse_args()
    if a.workload != "mpub" or a.variant not in ("blocking", "callback", "future"):
        d.unsupported(f"{a.workload} --variant {a.variant}")
    cmd = mpub(a.topic, [d.MSG] * a.batch)
    batches = a.n // a.batch
    if a.variant == "blocking":
        n, t0, t1 = blocking(a, cmd, batches)
    else:
        n, t0, t1 = asyncio.run(on_asyncio(a, cmd, batches))
    d.emit(n * a.batch, 1, t0, t1)


if __name__ == "__main__":
    main()
