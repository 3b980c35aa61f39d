import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smartnsq.errors import ProtocolError
from smartnsq.protocol import (
    CLASSIC,
    MessageLayout,
    PublishResult,
    RawMessage,
    decode_message,
    decode_publish_response,
    encode_message,
    partition_of,
)
from smartnsq.protocol.frames import FRAME_MESSAGE, data_end, encode_frame
from smartnsq.protocol.message import (
    EXT_JSON,
    EXT_NONE,
    check_spans,
    decode_span,
    span_bodies,
    span_heads,
    span_ids,
)

layouts = st.builds(MessageLayout, st.booleans(), st.booleans(), st.booleans())


@st.composite
def messages(draw, layout):
    ext_version = EXT_NONE
    ext = None
    if layout.ext:
        ext_version = draw(st.sampled_from([EXT_NONE, 2, EXT_JSON]))
        if ext_version != EXT_NONE:
            ext = draw(st.binary(max_size=200))
    offset = raw_size = None
    if layout.offset:
        offset = draw(st.integers(0, 2**64 - 1))
        raw_size = draw(st.integers(0, 2**32 - 1))
    return RawMessage(
        draw(st.integers(-(2**63), 2**63 - 1)),
        draw(st.integers(0, 2**16 - 1)),
        draw(st.binary(min_size=16, max_size=16)),
        draw(st.binary(max_size=300)),
        ext_version,
        ext,
        offset,
        raw_size,
    )


@given(st.data(), layouts)
def test_round_trip(data, layout):
    msg = data.draw(messages(layout))
    got = decode_message(encode_message(msg, layout), layout, RawMessage)
    for field in RawMessage.__slots__:
        assert getattr(got, field) == getattr(msg, field), field


@given(st.binary(max_size=200), layouts)
def test_garbage_raises_only_protocol_error(data, layout):
    try:
        decode_message(data, layout, RawMessage)
    except ProtocolError:
        pass


def test_classic_layout_hex_id():
    payload = struct.pack(">qH", 123, 2) + b"0a1b2c3d4e5f6071" + b"hello"
    msg = decode_message(payload, CLASSIC, RawMessage)
    assert (msg.timestamp, msg.attempts, msg.id, msg.body) == (
        123,
        2,
        b"0a1b2c3d4e5f6071",
        b"hello",
    )
    assert msg.offset is None and msg.ext is None


def test_fork_ordered_worked_example():
    # SUB_ORDERED on a non-ext topic: partition 1, internal id (1 << 50) + 1, trace id 0.
    internal = (1 << 50) + 1
    frame_data = (
        struct.pack(">qH", 10**18, 1)
        + struct.pack(">QQ", internal, 0)
        + struct.pack(">QI", 4096, 42)
        + b"hi"
    )
    msg = decode_message(frame_data, MessageLayout(binary_id=True, offset=True), RawMessage)
    assert msg.id == bytes.fromhex("00040000000000010000000000000000")
    assert msg.internal_id == internal
    assert msg.trace_id == 0
    assert msg.partition == 1
    assert (msg.offset, msg.raw_size, msg.body) == (4096, 42, b"hi")


def test_ext_block_comes_before_offset_block():
    header = b'{"k":"v"}'
    frame_data = (
        struct.pack(">qH", 1, 1)
        + struct.pack(">QQ", 5, 9)
        + bytes([EXT_JSON])
        + struct.pack(">H", len(header))
        + header
        + struct.pack(">QI", 77, 88)
        + b"body"
    )
    msg = decode_message(frame_data, MessageLayout(True, True, True), RawMessage)
    assert msg.headers == {"k": "v"}
    assert (msg.offset, msg.raw_size, msg.body, msg.trace_id) == (77, 88, b"body", 9)


def test_ext_version_zero_has_no_length():
    frame_data = struct.pack(">qH", 1, 1) + bytes(16) + b"\x00" + b"body"
    msg = decode_message(frame_data, MessageLayout(ext=True), RawMessage)
    assert msg.body == b"body" and msg.headers == {}


def test_ext_overrun_is_protocol_error():
    frame_data = struct.pack(">qH", 1, 1) + bytes(16) + b"\x04" + struct.pack(">H", 500) + b"x"
    with pytest.raises(ProtocolError, match="overruns"):
        decode_message(frame_data, MessageLayout(ext=True), RawMessage)


def test_partition_bits():
    assert partition_of((1023 << 50) | 12345) == 1023
    assert partition_of((1 << 60) | (3 << 50)) == 3  # bits above the mask are ignored


def test_publish_responses():
    assert decode_publish_response(b"OK") is None
    internal = (2 << 50) + 7
    traced = b"OK" + struct.pack(">QQQI", internal, 99, 1000, 36)
    result = decode_publish_response(traced)
    assert result == PublishResult(internal, 99, 1000, 36)
    assert result is not None and result.partition == 2
    assert result.message_id == traced[2:18]
    with pytest.raises(ProtocolError):
        decode_publish_response(b"OK" + b"x" * 5)


@given(st.data(), layouts, st.binary(max_size=30), st.binary(max_size=30))
def test_decode_span_cuts_in_place_what_decode_message_decodes(data, layout, before, after):
    msg = data.draw(messages(layout))
    frame = encode_message(msg, layout)
    src = before + frame + after
    start, end = len(before), len(before) + len(frame)
    got = decode_span(src, start, end, layout, RawMessage)
    for field in RawMessage.__slots__:
        assert getattr(got, field) == getattr(msg, field), field


@given(st.binary(max_size=60), layouts)
def test_decode_span_garbage_raises_only_protocol_error(data, layout):
    try:
        decode_span(data, 0, len(data), layout, RawMessage)
    except ProtocolError:
        pass


@given(st.lists(messages(CLASSIC), max_size=8))
def test_span_helpers_cut_ids_heads_and_bodies(msgs):
    src, spans = b"", []
    for msg in msgs:
        frame = encode_frame(FRAME_MESSAGE, encode_message(msg))
        spans.append((FRAME_MESSAGE, len(src) + 8, len(src) + len(frame)))
        src += frame
    check_spans(spans)
    assert span_ids(src, spans) == [m.id for m in msgs]
    assert span_heads(src, spans) == [(m.timestamp, m.attempts) for m in msgs]
    assert span_bodies(src, spans) == [m.body for m in msgs]
    assert [data_end(src, start) for _, start, _ in spans] == [end for _, _, end in spans]


def test_check_spans_refuses_a_frame_shorter_than_its_head():
    with pytest.raises(ProtocolError, match="too short"):
        check_spans([(FRAME_MESSAGE, 8, 34), (FRAME_MESSAGE, 42, 60)])
