"""The read side of a connection on its own: reads in, heartbeats, answers and message
batches out, in stream order (no socket, no event loop)."""

from __future__ import annotations

from typing import Any

import pytest

from smartnsq.errors import FinFailed, NotLeader, ServerError
from smartnsq.net.frame_pump import FramePump
from smartnsq.protocol import commands
from smartnsq.protocol.frames import (
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    OK_FRAME,
    encode_frame,
)
from tests.net.test_connection import StubLink

BODY = b"\0" * 8 + b"\0\1" + b"0123456789abcdef" + b"hello"


class FakeWaiter:
    """A request waiting for its answer: records what it got and when it was woken."""

    def __init__(self, publish: bool = False) -> None:
        self.publish = publish
        self.got: list[tuple[bytes, BaseException | None]] = []
        self.woken = 0

    def resolve(self, result: bytes, error: BaseException | None) -> None:
        self.got.append((result, error))

    def wake(self) -> None:
        self.woken += 1


class Pump:
    def __init__(self) -> None:
        self.link = StubLink()
        self.stopped: list[BaseException] = []
        self.pump = FramePump("127.0.0.1:1", self.link, 1 << 20, self.stopped.append)  # type: ignore[arg-type]
        self.events: list[Any] = []
        self.pump.on_messages = lambda src, spans: self.events.append(
            [src[s:e][-5:] for _, s, e in spans]
        )
        self.pump.before_read = lambda: self.events.append("read")

    def wait(self, waiter: FakeWaiter) -> FakeWaiter:
        self.pump.waiters.append(waiter)  # type: ignore[arg-type]
        return waiter


def test_messages_and_answers_keep_their_stream_order_and_heartbeats_are_answered() -> None:
    p = Pump()
    first = p.wait(FakeWaiter())
    data = b"".join(
        [
            encode_frame(FRAME_MESSAGE, BODY),
            encode_frame(FRAME_RESPONSE, HEARTBEAT),
            encode_frame(FRAME_MESSAGE, BODY),
            encode_frame(FRAME_MESSAGE, BODY),
            encode_frame(FRAME_RESPONSE, b"answer"),
            encode_frame(FRAME_MESSAGE, BODY),
        ]
    )
    p.pump.on_data(data)
    assert p.events == ["read", [b"hello"], [b"hello", b"hello"], [b"hello"]]
    assert p.link.written == [commands.NOP]  # the heartbeat: answered, not taken as an answer
    assert first.got == [(b"answer", None)] and first.woken == 1
    assert not p.stopped


def test_a_lone_ok_answers_the_oldest_request_without_a_read_callback() -> None:
    p = Pump()
    p.pump.before_read = None  # what a producer's connection has
    old, new = p.wait(FakeWaiter()), p.wait(FakeWaiter())
    p.pump.on_data(OK_FRAME)
    assert old.got == [(b"OK", None)] and old.woken == 1
    assert new.got == [] and list(p.pump.waiters) == [new]


def test_async_errors_go_to_their_callback_not_to_the_waiting_request() -> None:
    p = Pump()
    waiting = p.wait(FakeWaiter())
    async_errors: list[ServerError] = []
    p.pump.on_async_error = async_errors.append
    p.pump.on_data(encode_frame(FRAME_ERROR, b"E_FIN_FAILED unknown id"))
    assert [type(e) for e in async_errors] == [FinFailed]
    assert waiting.got == [] and not p.stopped  # not fatal: the connection goes on


def test_an_error_answers_its_request_typed_and_fatal_ones_stop_the_connection() -> None:
    p = Pump()
    publish = p.wait(FakeWaiter(publish=True))
    p.pump.on_data(encode_frame(FRAME_ERROR, b"E_FAILED_ON_NOT_LEADER"))
    ((_, err),) = publish.got
    assert isinstance(err, NotLeader) and not err.fatal  # on publish the fork goes on
    assert not p.stopped

    other = p.wait(FakeWaiter())
    with pytest.raises(NotLeader):
        p.pump.on_data(encode_frame(FRAME_ERROR, b"E_FAILED_ON_NOT_LEADER"))
    assert other.got[0][1] is p.stopped[0]  # answered, and the connection told to stop
    assert other.woken == 1  # woken even though the read raised
