import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smartnsq.errors import ProtocolError
from smartnsq.protocol import (
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    FrameDecoder,
    encode_frame,
)
from tests.helpers import chunked

frames_strategy = st.lists(
    st.tuples(
        st.sampled_from([FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE]),
        st.binary(max_size=300),
    ),
    max_size=20,
)


@given(frames_strategy, st.lists(st.integers(min_value=0), max_size=30))
def test_any_chunking_yields_the_same_frames(frames, cuts):
    stream = b"".join(encode_frame(t, d) for t, d in frames)
    dec = FrameDecoder()
    got = []
    for chunk in chunked(stream, cuts):
        got.extend(dec.feed(chunk))
    assert got == frames
    assert dec.buffered == 0


@given(frames_strategy, st.lists(st.integers(min_value=0), max_size=30))
def test_spans_and_the_count_of_non_message_frames(frames, cuts):
    stream = b"".join(encode_frame(t, d) for t, d in frames)
    dec = FrameDecoder()
    got = []
    for chunk in chunked(stream, cuts):
        src, spans = dec.feed_spans(chunk)
        assert dec.others == sum(1 for t, _, _ in spans if t != FRAME_MESSAGE)
        got += [(t, src[a:b]) for t, a, b in spans]
    assert got == frames


@given(frames_strategy, st.lists(st.integers(min_value=0), max_size=30), st.binary(max_size=40))
def test_a_lone_message_is_exactly_what_feed_spans_would_make_of_it(frames, cuts, noise):
    """lone_message(chunk) says a chunk is one whole message frame that feed_spans would
    return as the span (FRAME_MESSAGE, 8, len(chunk)); it is never wrong either way."""
    stream = b"".join(encode_frame(t, d) for t, d in frames) + noise
    dec = FrameDecoder(max_frame_size=200)
    try:
        for chunk in chunked(stream, cuts):
            lone = dec.lone_message(chunk)
            src, spans = dec.feed_spans(chunk)
            whole = src is chunk and spans == [(FRAME_MESSAGE, 8, len(chunk))]
            assert lone == (whole and dec.buffered == 0), (chunk, spans)
    except ProtocolError:
        assert not dec.lone_message(encode_frame(FRAME_MESSAGE, b"x" * 30))  # failed for good
    lone_frames = [encode_frame(t, d) for t, d in frames if t == FRAME_MESSAGE]
    assert all(FrameDecoder().lone_message(f) for f in lone_frames)


def test_lone_message_needs_a_message_frame_of_the_whole_chunk():
    msg = encode_frame(FRAME_MESSAGE, b"m" * 30)
    dec = FrameDecoder()
    assert dec.lone_message(msg)
    assert not dec.lone_message(msg + msg)  # two frames
    assert not dec.lone_message(msg[:-1])  # part of one
    assert not dec.lone_message(encode_frame(FRAME_RESPONSE, b"r" * 30))
    dec.feed_spans(msg[:5])
    assert not dec.lone_message(msg)  # bytes of an earlier frame are buffered
    assert not FrameDecoder(max_frame_size=20).lone_message(msg)  # over the limit
    # Too short to be a message: the consumer says so, as it would after feed_spans.
    assert FrameDecoder().lone_message(encode_frame(FRAME_MESSAGE, b""))


@given(st.binary(max_size=2000), st.lists(st.integers(min_value=0), max_size=10))
def test_arbitrary_bytes_raise_only_protocol_error(data, cuts):
    dec = FrameDecoder(max_frame_size=1024)
    try:
        for chunk in chunked(data, cuts):
            for ftype, payload in dec.feed(chunk):
                assert ftype in (FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE)
                assert len(payload) <= 1024
    except ProtocolError:
        pass


def test_heartbeat_is_a_plain_response_frame():
    dec = FrameDecoder()
    assert dec.feed(encode_frame(FRAME_RESPONSE, HEARTBEAT)) == [(FRAME_RESPONSE, HEARTBEAT)]


def test_frame_larger_than_limit_is_rejected_before_buffering_it():
    dec = FrameDecoder(max_frame_size=100)
    with pytest.raises(ProtocolError, match="invalid frame size 105"):
        dec.feed(struct.pack(">iI", 105, 0))
    with pytest.raises(ProtocolError, match="already failed"):
        dec.feed(b"")


@pytest.mark.parametrize("size", [-1, 0, 3])
def test_frame_size_too_small(size):
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(struct.pack(">iI", size, 0))


def test_unknown_frame_type():
    with pytest.raises(ProtocolError, match="unknown frame type 7"):
        FrameDecoder().feed(encode_frame(7, b"x"))


def test_partial_frame_waits_for_more():
    dec = FrameDecoder()
    frame = encode_frame(FRAME_RESPONSE, b"OK")
    assert dec.feed(frame[:5]) == []
    assert dec.buffered == 5
    assert dec.feed(frame[5:]) == [(FRAME_RESPONSE, b"OK")]


def test_next_frame_parses_one_and_leaves_the_rest():
    dec = FrameDecoder()
    dec.append(encode_frame(FRAME_RESPONSE, b"OK") + b"\xff\x06\x00\x00sNaPpY")
    assert dec.next_frame() == (FRAME_RESPONSE, b"OK")
    assert dec.take_remaining() == b"\xff\x06\x00\x00sNaPpY"
    assert dec.next_frame() is None


def test_feed_limit():
    dec = FrameDecoder()
    two = encode_frame(0, b"a") + encode_frame(0, b"b")
    assert dec.feed(two, limit=1) == [(0, b"a")]
    assert dec.feed(b"") == [(0, b"b")]
