"""Every surviving caller gets its own answer, whatever happens to the others.

A request whose bytes may reach nsqd keeps its place in the answer queue even when its caller
is cancelled or times out; otherwise every later request on the connection is handed the
answer of the one before it (a rejected publish reported as OK).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq import Connection, ConnectionConfig, Producer
from smartnsq.errors import NSQError, NSQTimeout
from smartnsq.protocol.frames import FRAME_RESPONSE, encode_frame
from tests.helpers import EVERY_LOOP, chunked, topic_stats, unique, wait_for

pytestmark = pytest.mark.reliability


class GateLink:
    """A transport that pushes back: every writer must wait in drain() until released."""

    compress: Callable[[bytes], bytes] | None = None
    last_read = 0.0
    closing = False
    must_drain = True
    local_address = "127.0.0.1:1"

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.gate = anyio.Event()
        self.draining = 0

    def write(self, data: bytes) -> None:
        self.written.append(data)

    write_now = write

    async def drain(self) -> None:
        self.draining += 1
        try:
            await self.gate.wait()
        finally:
            self.draining -= 1


# What happens to each caller: 0 nothing, 1 cancelled while its bytes wait to be sent,
# 2 cancelled while it waits for the answer, 3 times out while it waits for the answer.
fates = st.lists(st.integers(0, 3), min_size=1, max_size=12)


async def run_case(fate: list[int], cuts: list[int]) -> None:
    conn = Connection("127.0.0.1:1", GateLink(), ConnectionConfig())  # type: ignore[arg-type]
    link: GateLink = conn._link  # type: ignore[assignment]
    n = len(fate)
    got: dict[int, bytes | BaseException] = {}
    scopes = [anyio.CancelScope() for _ in range(n)]

    async def ask(i: int) -> None:
        with scopes[i]:
            try:
                got[i] = await conn.request(b"REQ %d\n" % i, timeout=None if fate[i] != 3 else 0.5)
            except NSQTimeout as exc:
                got[i] = exc

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(ask, i)
        while link.draining < n:  # every request written and stuck behind the full buffer
            await anyio.sleep(0)
        for i in range(n):
            if fate[i] == 1:
                scopes[i].cancel()
        while link.draining > n - fate.count(1):
            await anyio.sleep(0)
        link.gate.set()
        await anyio.sleep(0)
        conn._expire(conn._clock() + 1)  # the watchdog's tick: fate 3 is past its deadline
        for i in range(n):
            if fate[i] == 2:
                scopes[i].cancel()
        # nsqd answers every request it was sent, in order, each with its own payload
        stream = b"".join(
            encode_frame(FRAME_RESPONSE, b"ANSWER" + req[3:-1]) for req in link.written
        )
        for chunk in chunked(stream, cuts):
            conn._pump.on_data(chunk)
    assert sorted(link.written) == sorted(b"REQ %d\n" % i for i in range(n))
    for i in range(n):
        if fate[i] == 0:
            assert got[i] == b"ANSWER %d" % i, (fate, got)
        elif fate[i] == 3:
            assert isinstance(got[i], NSQTimeout)
        else:
            assert i not in got
    assert conn.pending == 0


@settings(max_examples=300, deadline=None)
@given(fates, st.lists(st.integers(0, 400), max_size=6), st.sampled_from(["asyncio", "trio"]))
def test_cancelled_and_timed_out_requests_keep_their_place(fate, cuts, backend):
    anyio.run(run_case, fate, cuts, backend=backend)


@pytest.mark.integration
@pytest.mark.anyio
@EVERY_LOOP
async def test_rejected_publishes_are_never_reported_as_ok_under_cancellation(
    cluster_factory, anyio_backend
):
    """A real nsqd rejects bodies over --max-msg-size; publishes are cancelled at random.

    Oversized publishes must raise (nsqd's E_BAD_MESSAGE closes the connection, so the
    producer reconnects), never return; every OK must be for a message nsqd stored.
    """
    cluster = cluster_factory("classic", nsqd=1, nsqd_args=["--max-msg-size=2048"])
    nsqd = cluster.nsqd[0]
    topic = unique("cancel")
    rnd = random.Random(7)
    ok_small = ok_big = cancelled = 0
    # max_message_size is the client's own limit: set high so oversized bodies reach nsqd
    async with Producer([nsqd.tcp], max_retries=0, timeout=5) as producer:
        await producer.publish(topic, b"first")

        async def one(i: int) -> None:
            nonlocal ok_small, ok_big, cancelled
            big = rnd.random() < 0.1
            body = (b"B" if big else b"s") * (4096 if big else 16)
            with anyio.move_on_after(rnd.choice([0, 0, 0.0005, 0.002, 1])) as scope:
                try:
                    await producer.publish(topic, body)
                except NSQError:
                    return
                if big:
                    ok_big += 1
                else:
                    ok_small += 1
            if scope.cancelled_caught:
                cancelled += 1

        for _ in range(20):
            async with anyio.create_task_group() as tg:
                for i in range(50):
                    tg.start_soon(one, i)
    assert ok_big == 0, f"{ok_big} rejected publishes were reported as OK"
    stats = wait_for(lambda: topic_stats(nsqd.http, topic), what="topic stats")
    stored = stats["message_count"] - 1
    assert ok_small <= stored <= ok_small + cancelled
    assert cancelled > 0  # the test did cancel publishes
