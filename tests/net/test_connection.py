"""Connection's request/answer matching, fed bytes directly (no socket)."""

from __future__ import annotations

from collections.abc import Callable

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq import Connection, ConnectionConfig
from smartnsq.protocol.frames import FRAME_RESPONSE, OK_FRAME, encode_frame
from tests.helpers import chunked


class StubLink:
    """Just enough of a transport: records writes, never blocks."""

    compress: Callable[[bytes], bytes] | None = None
    last_read = 0.0
    closing = False
    must_drain = False
    local_address = "127.0.0.1:1"

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    write_now = write


async def answers(payloads: list[bytes], cuts: list[int]) -> list[bytes]:
    conn = Connection("127.0.0.1:1", StubLink(), ConnectionConfig())  # type: ignore[arg-type]
    got: dict[int, bytes] = {}

    async def ask(i: int) -> None:
        got[i] = await conn.request(b"PUB t\n")

    async with anyio.create_task_group() as tg:
        for i in range(len(payloads)):
            tg.start_soon(ask, i)
            while conn.pending <= i:  # queued in order
                await anyio.sleep(0)
        stream = b"".join(encode_frame(FRAME_RESPONSE, p) for p in payloads)
        for chunk in chunked(stream, cuts):
            conn._pump.on_data(chunk)
    return [got[i] for i in range(len(payloads))]


# A heartbeat is not an answer: nsqd never answers a request with those bytes.
payload = st.one_of(st.just(b"OK"), st.binary(max_size=12).filter(lambda b: b != b"_heartbeat_"))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(payload, min_size=1, max_size=6),
    st.lists(st.integers(0, 200), max_size=8),
    st.sampled_from(["asyncio", "trio"]),
)
def test_every_request_gets_its_own_answer_for_any_chunking(payloads, cuts, backend):
    assert anyio.run(answers, payloads, cuts, backend=backend) == payloads


def test_a_read_that_looks_like_a_lone_ok_but_ends_a_frame_is_not_taken_for_one():
    # The first read is the head of a frame whose payload is the bytes of an OK frame, so
    # the second read equals an OK frame but is the rest of the first answer.
    payloads = [OK_FRAME, b"OK"]
    stream = encode_frame(FRAME_RESPONSE, payloads[0]) + encode_frame(FRAME_RESPONSE, b"OK")
    assert stream[8:18] == OK_FRAME
    for backend in ("asyncio", "trio"):
        assert anyio.run(answers, payloads, [8, 18], backend=backend) == payloads
