"""A graceful stop requeues a message nsqd sends after CLOSE_WAIT, and does not wait for
nsqd's output buffer timeout to catch it.

nsqd's sender can take a message off the channel just before RDY 0 reaches it and write it
after the CLOSE_WAIT. Both nsqds then flush at once, as the client is no longer ready: on
loopback such a message followed the CLOSE_WAIT by 0-2 ms (13 ms with the CPUs
oversubscribed), in 0.4-7 % of stops under a steady flow. Real nsqd shows it only by timing;
this fake server does it every time.
"""

from __future__ import annotations

import json
import struct

import anyio
import anyio.abc
import pytest

from smartnsq import Consumer, Message
from smartnsq.protocol.frames import FRAME_MESSAGE, FRAME_RESPONSE, encode_frame
from tests.fakes import Serve, fake_server, read_identify

pytestmark = [pytest.mark.reliability, pytest.mark.anyio]

FIRST, STRAGGLER = b"0000000000000001", b"0000000000000002"


def message(mid: bytes, body: bytes) -> bytes:
    return encode_frame(FRAME_MESSAGE, struct.pack(">qH", 1, 1) + mid + body)


def server(output_buffer_timeout_ms: int, received: list[bytes], closed: anyio.Event) -> Serve:
    """Sends one message on the first RDY; answers CLS with CLOSE_WAIT and, 5 ms later, a
    straggler. Every command line the consumer sends after IDENTIFY goes to ``received``."""

    async def serve(stream: anyio.abc.SocketStream) -> None:
        await read_identify(stream)
        reply = {"max_rdy_count": 2500, "output_buffer_timeout": output_buffer_timeout_ms}
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
                        await anyio.sleep(0.005)
                        await stream.send(message(STRAGGLER, b"late"))
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            closed.set()
            raise

    return serve


async def stop_after_first(
    output_buffer_timeout_ms: int, stop_within: float = 5.0
) -> tuple[list[bytes], list[bytes]]:
    """A consumer handles the first message and stops within ``stop_within`` seconds;
    returns (handled, received)."""
    received: list[bytes] = []
    closed = anyio.Event()
    handled: list[bytes] = []

    async def handler(msg: Message) -> None:
        handled.append(msg.body)

    async with fake_server(server(output_buffer_timeout_ms, received, closed)) as address:
        with anyio.fail_after(5):
            consumer = Consumer("t", "c", handler, nsqd_tcp_addresses=[address])
            async with consumer:
                while not handled:
                    await anyio.sleep(0.01)
                began = anyio.current_time()
                await consumer.stop()  # shielded inside: fail_after would not cut it
                assert anyio.current_time() - began < stop_within
            await closed.wait()
    return handled, received


async def test_a_message_sent_after_close_wait_is_requeued(anyio_backend: str) -> None:
    handled, received = await stop_after_first(200)
    assert handled == [b"first"]
    assert b"FIN " + FIRST in received
    assert b"REQ " + STRAGGLER + b" 0" in received


async def test_the_stop_does_not_wait_for_the_output_buffer_timeout(anyio_backend: str) -> None:
    # nsqd flushes a straggler at once, so its 10 s buffer timeout must not hold the stop
    # (the stop lingered for it, cut to 2 s, before).
    handled, received = await stop_after_first(10_000, stop_within=1.5)
    assert handled == [b"first"]
    assert b"REQ " + STRAGGLER + b" 0" in received
