import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smartnsq.errors import InvalidArgument
from smartnsq.protocol import commands as c

ID = bytes(range(16))  # binary, with a newline byte (0x0a) inside on purpose


def split_line(data: bytes) -> tuple[bytes, bytes]:
    line, _, rest = data.partition(b"\n")
    return line, rest


def body_of(rest: bytes) -> bytes:
    (n,) = struct.unpack(">I", rest[:4])
    assert len(rest) == 4 + n
    return rest[4:]


def test_identify_is_json_body():
    data = c.identify({"feature_negotiation": True})
    line, rest = split_line(data)
    assert line == b"IDENTIFY"
    assert json.loads(body_of(rest)) == {"feature_negotiation": True}


def test_auth():
    assert c.auth(b"s3cret") == b"AUTH\n\x00\x00\x00\x06s3cret"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (c.sub("t", "ch"), b"SUB t ch\n"),
        (c.sub("t", "ch", 3), b"SUB t ch 3\n"),
        (c.sub_ordered("t", "ch", 0), b"SUB_ORDERED t ch 0\n"),
        (c.sub_ordered("t", "ch"), b"SUB_ORDERED t ch\n"),
        (c.sub_advanced("t", "ch", 1, "msgcount:5"), b"SUB_ADVANCED t ch 1 msgcount:5\n"),
        (c.rdy(2500), b"RDY 2500\n"),
        (c.NOP, b"NOP\n"),
        (c.CLS, b"CLS\n"),
        (c.fin(ID), b"FIN " + ID + b"\n"),
        (c.req(ID, 1500), b"REQ " + ID + b" 1500\n"),
        (c.req(ID, -5), b"REQ " + ID + b" 0\n"),
        (c.touch(ID), b"TOUCH " + ID + b"\n"),
    ],
)
def test_line_commands(data, expected):
    assert data == expected


def test_fin_is_exactly_21_bytes_with_a_binary_id():
    assert len(c.fin(ID)) == 21
    assert len(c.touch(ID)) == 23


def test_bad_id_length():
    with pytest.raises(InvalidArgument, match="16 bytes"):
        c.fin(b"short")


def test_pub_with_and_without_partition():
    assert c.pub("t", b"hi") == b"PUB t\n\x00\x00\x00\x02hi"
    assert c.pub("t", b"hi", 2) == b"PUB t 2\n\x00\x00\x00\x02hi"


def test_dpub():
    assert c.dpub("t", 1500, b"x") == b"DPUB t 1500\n\x00\x00\x00\x01x"


def decode_mpub(body: bytes) -> list[bytes]:
    (count,) = struct.unpack_from(">I", body)
    pos, out = 4, []
    for _ in range(count):
        (n,) = struct.unpack_from(">I", body, pos)
        out.append(body[pos + 4 : pos + 4 + n])
        pos += 4 + n
    assert pos == len(body)
    return out


@given(st.lists(st.binary(min_size=1, max_size=50), min_size=1, max_size=30))
def test_mpub_round_trip(bodies):
    line, rest = split_line(c.mpub("t", bodies, 1))
    assert line == b"MPUB t 1"
    assert decode_mpub(body_of(rest)) == bodies


@given(st.integers(1, 40), st.integers(1, 30), st.sampled_from([None, 3]))
def test_mpub_of_same_size_bodies(size, count, partition):
    bodies = [bytes([i % 256]) * size for i in range(count)]
    fast = c.mpub("t", bodies, partition, size)
    assert fast == c.mpub("t", bodies, partition)
    line, rest = split_line(fast)
    assert line == (b"MPUB t" if partition is None else b"MPUB t 3")
    assert decode_mpub(body_of(rest)) == bodies


@given(st.binary(min_size=1, max_size=50), st.integers(0, 2**64 - 1))
def test_pub_trace(body, trace_id):
    line, rest = split_line(c.pub_trace("t", body, trace_id, 0))
    assert line == b"PUB_TRACE t 0"
    payload = body_of(rest)
    assert struct.unpack(">Q", payload[:8])[0] == trace_id
    assert payload[8:] == body


def test_mpub_trace():
    line, rest = split_line(c.mpub_trace("t", [b"a", b"bc"], [1, 2]))
    assert line == b"MPUB_TRACE t"
    items = decode_mpub(body_of(rest))
    assert items == [struct.pack(">Q", 1) + b"a", struct.pack(">Q", 2) + b"bc"]
    with pytest.raises(InvalidArgument, match="one per message"):
        c.mpub_trace("t", [b"a"], [])


def test_pub_ext():
    line, rest = split_line(c.pub_ext("t", b"body", {"##trace_id": "5"}, 1))
    assert line == b"PUB_EXT t 1"
    payload = body_of(rest)
    (n,) = struct.unpack(">H", payload[:2])
    assert json.loads(payload[2 : 2 + n]) == {"##trace_id": "5"}
    assert payload[2 + n :] == b"body"


def test_mpub_ext_allows_messages_without_header():
    line, rest = split_line(c.mpub_ext("t", [b"a", b"b"], [{"k": 1}, None]))
    assert line == b"MPUB_EXT t"
    items = decode_mpub(body_of(rest))
    assert items[1] == b"\x00\x00b"
    (n,) = struct.unpack(">H", items[0][:2])
    assert json.loads(items[0][2 : 2 + n]) == {"k": 1} and items[0][2 + n :] == b"a"


def test_ext_header_too_large():
    with pytest.raises(InvalidArgument, match="65534"):
        c.pub_ext("t", b"x", {"k": "v" * 70000})


def test_ext_header_must_be_json():
    with pytest.raises(InvalidArgument, match="JSON-serialisable"):
        c.pub_ext("t", b"x", {"k": object()})


ids = st.lists(st.binary(min_size=16, max_size=16), max_size=40)


@given(ids)
def test_fins_equal_the_single_fins_joined(batch):
    assert c.fins(batch) == b"".join(map(c.fin, batch))


@given(ids, st.integers(-5, 2**31))
def test_reqs_equal_the_single_reqs_joined(batch, delay_ms):
    assert c.reqs(batch, delay_ms) == b"".join(c.req(i, delay_ms) for i in batch)


@given(ids)
def test_touches_equal_the_single_touches_joined(batch):
    assert c.touches(batch) == b"".join(map(c.touch, batch))


@pytest.mark.parametrize("encode", [c.fins, c.touches, lambda batch: c.reqs(batch, 0)])
def test_batches_check_every_id(encode):
    with pytest.raises(InvalidArgument, match="16 bytes"):
        encode([ID, b"short", ID])
