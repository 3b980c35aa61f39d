"""The delivery module: its hot paths make what the general constructor makes, and its
answers write what the protocol encodes, keeping the subscription's in-flight count."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smartnsq.consumer.message import (
    Message,
    claim_fin,
    delivered,
    delivered_at,
    delivered_ordered,
    delivered_read,
    fin_owed,
    owed,
    sub_of,
    times,
    write_fin,
    write_fins,
    write_req,
    write_reqs,
    write_touch,
    write_touches,
)
from smartnsq.errors import ConnectionClosed, NSQError, ProtocolError
from smartnsq.protocol import commands
from smartnsq.protocol.frames import FRAME_MESSAGE, FrameDecoder, encode_frame
from smartnsq.protocol.message import CLASSIC, MessageLayout, RawMessage, encode_message

ORDERED = MessageLayout(binary_id=True, offset=True)
FIELDS = RawMessage.__slots__


class Sub:
    """What a message needs of the subscription that delivered it."""

    def __init__(self, layout: MessageLayout = CLASSIC, gone: bool = False) -> None:
        self.layout = layout
        self.in_flight = 0
        self.written: list[bytes] = []
        self.queued: list[bytes] = []
        self.gone = gone
        self.address = "127.0.0.1:4150"
        self.partition = None
        self.answers: Any = None

    def write(self, data: bytes) -> None:
        if self.gone:
            raise ConnectionClosed("gone")
        self.written.append(data)

    def queue(self, data: bytes) -> None:
        if self.gone:
            raise ConnectionClosed("gone")
        self.queued.append(data)


def read_of(msgs: list[RawMessage], layout: MessageLayout) -> tuple[bytes, list[Any]]:
    return FrameDecoder().feed_spans(
        b"".join(encode_frame(FRAME_MESSAGE, encode_message(m, layout)) for m in msgs)
    )


def classic() -> st.SearchStrategy[RawMessage]:
    return st.builds(
        RawMessage,
        st.integers(-(2**63), 2**63 - 1),
        st.integers(0, 2**16 - 1),
        st.binary(min_size=16, max_size=16),
        st.binary(max_size=100),
    )


def ordered() -> st.SearchStrategy[RawMessage]:
    return st.builds(
        RawMessage,
        st.integers(-(2**63), 2**63 - 1),
        st.integers(0, 2**16 - 1),
        st.binary(min_size=16, max_size=16),
        st.binary(max_size=100),
        st.just(0),
        st.none(),
        st.integers(0, 2**64 - 1),
        st.integers(0, 2**32 - 1),
    )


def same(got: Message, want: RawMessage, sub: Sub) -> None:
    for field in FIELDS:
        assert getattr(got, field) == getattr(want, field), field
    assert sub_of(got) is sub and owed(got) and not got.has_responded


@given(st.lists(classic(), max_size=6))
def test_a_classic_reads_hot_paths_make_what_delivered_makes(msgs: list[RawMessage]) -> None:
    sub = Sub()
    src, spans = read_of(msgs, CLASSIC)
    for got, want in zip(delivered_read(sub, src, spans), msgs, strict=True):
        same(got, want, sub)
    for (_, start, end), want in zip(spans, msgs, strict=True):
        same(delivered(sub, src, start, end), want, sub)
        same(delivered_at(sub, src, start), want, sub)


@given(st.lists(ordered(), max_size=4), st.floats(0, 1e9))
def test_an_ordered_reads_hot_path_makes_what_delivered_makes(
    msgs: list[RawMessage], now: float
) -> None:
    sub = Sub(ORDERED)
    src, spans = read_of(msgs, ORDERED)
    for (_, start, end), want in zip(spans, msgs, strict=True):
        got, internal_id = delivered_ordered(sub, src, start, end, now)
        same(got, want, sub)
        assert internal_id == want.internal_id
        assert times(got) == (now, now)
        same(delivered(sub, src, start, end, now), want, sub)


def test_frames_too_short_for_their_head_raise_protocol_error() -> None:
    frame = encode_frame(FRAME_MESSAGE, bytes(25))  # one byte short of a classic head
    sub: Any = Sub()
    with pytest.raises(ProtocolError, match="too short"):
        delivered_read(sub, frame, [(FRAME_MESSAGE, 8, len(frame))])
    with pytest.raises(ProtocolError, match="too short"):
        delivered_at(sub, frame, 8)
    with pytest.raises(ProtocolError, match="offset block"):
        delivered_ordered(Sub(ORDERED), frame, 8, len(frame), 0.0)


def made(sub: Sub, mid: bytes = b"0123456789abcdef") -> Message:
    sub.in_flight += 1  # as intake counts it
    frame = encode_frame(FRAME_MESSAGE, encode_message(RawMessage(1, 2, mid, b"body")))
    return delivered(sub, frame, 8, len(frame))


def test_one_answer_per_message_written_as_the_protocol_encodes_it() -> None:
    sub = Sub()
    a, b, c = made(sub, b"a" * 16), made(sub, b"b" * 16), made(sub, b"c" * 16)
    write_touch(a)
    assert write_fin(a) and write_req(b, 1500) and fin_owed(c)
    assert sub.queued == [commands.touch(a.id)]
    assert sub.written == [commands.fin(a.id), commands.req(b.id, 1500), commands.fin(c.id)]
    assert sub.in_flight == 0 and all(m.has_responded and not owed(m) for m in (a, b, c))
    for answer in (write_fin, lambda m: write_req(m, 0), write_touch):
        with pytest.raises(NSQError, match="already answered"):
            answer(a)
    assert fin_owed(a) is None and not claim_fin(a)  # nothing owed: nothing written
    assert sub.in_flight == 0 and len(sub.written) == 3


def test_a_message_answered_by_hand_is_not_owed_an_automatic_fin() -> None:
    sub = Sub()
    msg = made(sub)
    msg.disable_auto_response()
    assert not owed(msg) and fin_owed(msg) is None and not claim_fin(msg)
    assert sub.written == [] and not msg.has_responded
    assert write_fin(msg) and sub.in_flight == 0  # still answerable by hand


def test_a_thread_claims_the_fin_and_the_loop_writes_the_run_of_ids() -> None:
    sub = Sub()
    msgs = [made(sub, bytes([i]) * 16) for i in range(3)]
    ids = [m.id for m in msgs if claim_fin(m)]
    assert len(ids) == 3 and sub.in_flight == 3  # claimed, not written yet
    assert write_fins(sub, ids)
    assert sub.written == [commands.fins(ids)] and sub.in_flight == 0
    assert all(m.has_responded for m in msgs)


def test_runs_of_ids_leave_the_in_flight_count_even_when_the_connection_is_gone() -> None:
    ids = [b"a" * 16, b"b" * 16]
    up, gone = Sub(), Sub(gone=True)
    up.in_flight = gone.in_flight = 4
    assert write_reqs(up, ids, 0) and write_fins(up, ids)
    write_touches(up, ids)
    assert up.written == [commands.reqs(ids, 0), commands.fins(ids), commands.touches(ids)]
    assert up.in_flight == 0  # touches answer nothing
    assert not write_fins(gone, ids) and not write_reqs(gone, ids, 0)
    write_touches(gone, ids)  # dropped, no error
    assert gone.in_flight == 0  # nsqd redelivers them: no longer ours
    msg = made(gone)
    assert not write_fin(msg) and msg.has_responded and gone.in_flight == 0
