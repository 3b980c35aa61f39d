"""A graceful stop requeues a message nsqd sends after CLOSE_WAIT.

nsqd's sender can take a message off the channel just before RDY 0 reaches it and write it
after the CLOSE_WAIT, to go out at nsqd's next flush (within its output buffer timeout).
Real nsqd shows it only by timing (seen once in a full suite run: one message left in
flight after a stop); this fake server does it every time.
"""

from __future__ import annotations

import json
import struct

import anyio
import anyio.abc
import pytest

from smartnsq import Consumer, Message
from smartnsq.protocol.frames import FRAME_MESSAGE, FRAME_RESPONSE, encode_frame
from tests.fakes import fake_server, read_identify

pytestmark = [pytest.mark.reliability, pytest.mark.anyio]

FIRST, STRAGGLER = b"0000000000000001", b"0000000000000002"


def message(mid: bytes, body: bytes) -> bytes:
    return encode_frame(FRAME_MESSAGE, struct.pack(">qH", 1, 1) + mid + body)


async def test_a_message_sent_after_close_wait_is_requeued(anyio_backend: str) -> None:
    received: list[bytes] = []  # every command line the consumer sent after IDENTIFY
    closed = anyio.Event()

    async def serve(stream: anyio.abc.SocketStream) -> None:
        await read_identify(stream)
        reply = {"max_rdy_count": 2500, "output_buffer_timeout": 200}
        await stream.send(encode_frame(FRAME_RESPONSE, json.dumps(reply).encode()))
        buf = b""
        sent_first = False
        try:
            while True:
                buf += await stream.receive()
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    received.append(line)
                    if line.startswith(b"SUB "):
                        await stream.send(encode_frame(FRAME_RESPONSE, b"OK"))
                    elif line.startswith(b"RDY ") and line != b"RDY 0" and not sent_first:
                        sent_first = True
                        await stream.send(message(FIRST, b"first"))
                    elif line == b"CLS":
                        await stream.send(encode_frame(FRAME_RESPONSE, b"CLOSE_WAIT"))
                        await anyio.sleep(0.1)  # then nsqd's next flush
                        await stream.send(message(STRAGGLER, b"late"))
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            closed.set()
            raise

    handled: list[bytes] = []

    async def handler(msg: Message) -> None:
        handled.append(msg.body)

    async with fake_server(serve) as address:
        with anyio.fail_after(10):
            async with Consumer("t", "c", handler, nsqd_tcp_addresses=[address]):
                while not handled:
                    await anyio.sleep(0.01)
            await closed.wait()
    assert handled == [b"first"]
    assert b"FIN " + FIRST in received
    assert b"REQ " + STRAGGLER + b" 0" in received
