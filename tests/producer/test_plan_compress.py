"""Producer compression and tags, without a server: the commands that would be sent."""

from __future__ import annotations

import json
import os
import struct

import pytest
import snappy

from smartnsq import Producer
from smartnsq import sync as smartsync
from smartnsq.errors import InvalidArgument, InvalidTag, InvalidTopic, InvalidType, MessageTooLarge
from smartnsq.producer.plan import Batches, Plan, Request
from tests.producer import parts

BIG = b"compress me " * 3000  # 36,000 bytes, shrinks a lot


def producer(**options) -> Plan:
    """What a Producer with these options plans."""
    return parts.plan(**options)


def plan(p: Plan, body: bytes, **kw) -> Request | bytes:
    args = {
        "delay": None,
        "partition": None,
        "sharding_key": None,
        "trace_id": None,
        "headers": None,
        "timeout": None,
        **kw,
    }
    tag = args.pop("tag", None)
    return p.publish("t", body, *args.values(), tag)


def pub_ext(data: bytes) -> tuple[dict, bytes]:
    """(headers, body) of a PUB_EXT command."""
    line, _, rest = data.partition(b"\n")
    assert line.split()[0] == b"PUB_EXT"
    (size,) = struct.unpack_from(">I", rest)
    (hlen,) = struct.unpack_from(">H", rest, 4)
    assert size == len(rest) - 4
    return json.loads(rest[6 : 6 + hlen]), rest[6 + hlen :]


def mpub_ext(data: bytes) -> list[tuple[dict, bytes]]:
    line, _, rest = data.partition(b"\n")
    assert line.split()[0] == b"MPUB_EXT"
    (count,) = struct.unpack_from(">II", rest)[1:]
    pos, out = 8, []
    for _ in range(count):
        (size,) = struct.unpack_from(">I", rest, pos)
        (hlen,) = struct.unpack_from(">H", rest, pos + 4)
        header = rest[pos + 6 : pos + 6 + hlen]
        out.append((json.loads(header) if header else {}, rest[pos + 6 + hlen : pos + 4 + size]))
        pos += 4 + size
    assert pos == len(rest)
    return out


@pytest.mark.parametrize("cls", [Producer, smartsync.Producer])
def test_options_are_checked_at_construction(cls):
    addr = ["127.0.0.1:4150"]
    with pytest.raises(InvalidArgument, match="compress_codec must be one of"):
        cls(addr, compress_codec="zstd")  # checked even while no topic is compressed
    with pytest.raises(InvalidType, match="compress_topics"):
        cls(addr, compress_topics="t")
    with pytest.raises(InvalidTopic):
        cls(addr, compress_topics=["no spaces"])
    with pytest.raises(InvalidArgument, match="compress_min_size"):
        cls(addr, compress_topics=["t"], compress_min_size=-1)


def test_off_or_small_or_other_topic_stays_a_plain_pub():
    assert plan(producer(), BIG) == b"PUB t\n" + struct.pack(">I", len(BIG)) + BIG
    on = producer(compress_topics=["other"])
    assert plan(on, BIG).startswith(b"PUB t\n")
    on = producer(compress_topics=["t"], compress_min_size=len(BIG) + 1)
    assert plan(on, BIG).startswith(b"PUB t\n")


def test_compressed_publish_is_pub_ext_with_go_nsq_headers():
    p = producer(compress_topics=["t"])
    request = plan(p, BIG, headers={"k": "v"}, tag="blue")
    assert isinstance(request, Request)
    headers, body = pub_ext(request.build(None))
    assert headers == {
        "k": "v",
        "##client_dispatch_tag": "blue",
        "nsq.client.compress": "2",
        "nsq.msg.size": str(len(BIG)),
    }
    assert snappy.decompress(body) == BIG
    # at exactly compress_min_size it is compressed, as go-nsq (size >= threshold)
    exact = producer(compress_topics=["t"], compress_min_size=len(BIG))
    assert pub_ext(plan(exact, BIG).build(None))[0]["nsq.msg.size"] == str(len(BIG))


def test_size_limit_applies_to_what_is_sent():
    p = producer(
        compress_topics=["t"], max_message_size=4096, max_body_size=8192, compress_min_size=100
    )
    assert isinstance(plan(p, BIG), Request)  # 36 kB that compress below 4 kB
    with pytest.raises(MessageTooLarge):
        plan(p, os.urandom(5000))


def test_header_and_tag_mistakes():
    p = producer(compress_topics=["t"])
    for key in ("nsq.client.compress", "nsq.msg.size"):
        with pytest.raises(InvalidArgument, match="drop them"):
            plan(p, b"x", headers={key: "2"})
    with pytest.raises(InvalidArgument, match="tag"):
        plan(p, b"x", tag="a", delay=1)
    with pytest.raises(InvalidTag):
        plan(p, b"x", tag="a b")
    request = plan(p, b"x", tag="a")  # a small body: tagged, not compressed
    assert pub_ext(request.build(3)) == ({"##client_dispatch_tag": "a"}, b"x")
    assert request.build(3).startswith(b"PUB_EXT t 3\n")


def test_publish_many_with_tags_and_compression():
    p = producer(compress_topics=["t"])
    bodies = [BIG, b"small", b"other"]
    batches = p.many("t", bodies, None, None, None, None, ["a", None, "b"])
    assert isinstance(batches, Batches) and batches.total == 3
    (request,) = batches.requests
    got = mpub_ext(request.build(None))
    assert got[0][0] == {
        "##client_dispatch_tag": "a",
        "nsq.client.compress": "2",
        "nsq.msg.size": str(len(BIG)),
    }
    assert snappy.decompress(got[0][1]) == BIG
    assert got[1] == ({}, b"small")
    assert got[2] == ({"##client_dispatch_tag": "b"}, b"other")
    # nothing to compress and no tags: the plain MPUB
    plain = p.many("t", [b"a", b"b"], None, None, None, None)
    assert isinstance(plain, Batches) and plain.requests[0].build(None).startswith(b"MPUB t\n")


def test_publish_many_to_other_topics_keeps_the_fast_mpub():
    p = producer(compress_topics=["other"])
    assert p.many("t", [BIG, b"b"], None, None, None, None) == producer().many(
        "t", [BIG, b"b"], None, None, None, None
    )
    assert isinstance(p.many("t", [BIG], None, None, None, None), bytes)


def test_publish_many_ext_batches_fit_max_body_size():
    p = producer(max_message_size=1000, max_body_size=1100)
    bodies = [b"%03d" % i * 100 for i in range(10)]  # 300 bytes each
    batches = p.many("t", bodies, None, None, None, None, ["x"] * 10)
    assert isinstance(batches, Batches)
    sent = []
    for request in batches.requests:
        data = request.build(None)
        body = data.partition(b"\n")[2][4:]
        assert len(body) <= 1100
        sent += [b for _, b in mpub_ext(data)]
        assert request.count == len(mpub_ext(data))
    assert sent == bodies and len(batches.requests) > 1


def test_publish_many_tag_mistakes():
    p = producer()
    with pytest.raises(InvalidArgument, match="one per message"):
        p.many("t", [b"a", b"b"], None, None, None, None, ["x"])
    with pytest.raises(InvalidType):
        p.many("t", [b"a"], None, None, None, None, "x")
    with pytest.raises(InvalidTag):
        p.many("t", [b"a"], None, None, None, None, ["a/b"])
    with pytest.raises(InvalidArgument, match="trace_ids"):
        p.many("t", [b"a"], None, None, [1], None, ["a"])
