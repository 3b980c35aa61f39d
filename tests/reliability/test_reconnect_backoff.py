"""A subscription the server ends with a fatal error at once does not reset the back-off.

While a Youzan partition changes leader, the new leader accepts SUB and then refuses the
first FIN with the fatal ``E_FAILED_ON_NOT_WRITABLE`` (closing the connection), for tens of
seconds. Each accepted SUB used to reset the consumer's count of failed attempts: it
reconnected every 0.1-0.4 s and logged a WARNING each time (about 20 in 40 s).
"""

from __future__ import annotations

import itertools
import logging

import anyio
import anyio.abc
import pytest

from smartnsq import Consumer, Message
from smartnsq.protocol.frames import FRAME_ERROR, FRAME_RESPONSE, encode_frame
from tests.fakes import IDENTIFY_OK, fake_server, read_identify, read_until_closed

pytestmark = [pytest.mark.reliability, pytest.mark.anyio]

RECONNECT_MIN, RECONNECT_MAX = 0.1, 0.8


async def test_a_subscription_refused_at_once_keeps_the_back_off_growing(anyio_backend, caplog):
    caplog.set_level(logging.DEBUG, "smartnsq.consumer")
    connected: list[float] = []
    enough = anyio.Event()

    async def not_writable(stream: anyio.abc.SocketStream) -> None:
        connected.append(anyio.current_time())
        if len(connected) >= 6:
            enough.set()
        await read_identify(stream)
        await stream.send(IDENTIFY_OK)
        buf = b""
        while b"SUB" not in buf or not buf.endswith(b"\n"):
            buf += await stream.receive()
        await stream.send(encode_frame(FRAME_RESPONSE, b"OK"))
        # as the fork answers a FIN while the partition is not writable: fatal, then closed
        await stream.send(encode_frame(FRAME_ERROR, b"E_FAILED_ON_NOT_WRITABLE "))
        await read_until_closed(stream)

    async def handle(message: Message) -> None:
        pass

    async with fake_server(not_writable) as address:
        consumer = Consumer(
            "t",
            "ch",
            handle,
            nsqd_tcp_addresses=[address],
            reconnect_min=RECONNECT_MIN,
            reconnect_max=RECONNECT_MAX,
        )
        async with consumer:
            with anyio.fail_after(20):
                await enough.wait()

    gaps = [b - a for a, b in itertools.pairwise(connected[:6])]
    # the 4th and 5th delays are min(max, min * 2**n) = 0.8 s, times 0.5-1 of jitter; without
    # the count they stayed at 0.2 s x 0.5-1 (plus a reconnect's own time)
    assert min(gaps[3:]) >= RECONNECT_MAX / 2, gaps
    records = [r for r in caplog.records if r.name == "smartnsq.consumer"]
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # one outage, logged once
    assert "E_FAILED_ON_NOT_WRITABLE" in warnings[0]
    infos = [r.getMessage() for r in records if r.levelno == logging.INFO]
    assert len(infos) == 2, infos  # subscribed, then "subscribed again" once
