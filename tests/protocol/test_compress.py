"""The codec layer of go-nsq's client-side compression, and tag checks (sans-IO)."""

from __future__ import annotations

import gzip
import sys

import lz4.block
import pytest
import snappy
from hypothesis import given
from hypothesis import strategies as st

from smartnsq.errors import (
    CodecUnavailable,
    DecompressFailed,
    InvalidArgument,
    InvalidTag,
    InvalidType,
    ProtocolError,
    TagNotSupported,
    error_from_frame,
)
from smartnsq.protocol.compress import (
    check_codec,
    compress_body,
    decompress_body,
    maybe_compressed,
    unpack,
)
from smartnsq.protocol.message import EXT_JSON, RawMessage
from smartnsq.protocol.tags import check_tag, check_tag_subscription

CODECS = ["gzip", "snappy", "lz4"]
# compressible bodies: runs of a few symbols
bodies = st.lists(st.sampled_from([b"a", b"bc", b"\x00", b"xyz" * 5]), min_size=1).map(b"".join)


@pytest.mark.parametrize("codec", CODECS)
@given(body=st.binary(min_size=1, max_size=4096) | bodies)
def test_round_trip(codec, body):
    packed = compress_body(codec, body)
    if packed is None:  # only lz4 refuses, and only when the block would not be smaller
        assert codec == "lz4"
        assert len(lz4.block.compress(body, store_size=False)) >= len(body)
        return
    data, headers = packed
    assert headers == {
        "nsq.client.compress": str(CODECS.index(codec) + 1),
        "nsq.msg.size": str(len(body)),
    }
    assert decompress_body({**headers, "user": "x"}, data) == body


@given(body=bodies)
def test_the_blocks_are_the_libraries_own_formats(body):
    assert gzip.decompress(compress_body("gzip", body)[0]) == body
    assert snappy.decompress(compress_body("snappy", body)[0]) == body
    packed = compress_body("lz4", body)
    if packed is not None:  # a raw block: no size prefix, no frame
        assert lz4.block.decompress(packed[0], uncompressed_size=len(body)) == body


def test_lz4_without_the_size_header_guesses_as_go_nsq():
    body = bytes(range(256)) * 2  # shrinks to about half: within go-nsq's 10x guess
    data, _ = compress_body("lz4", body)
    assert decompress_body({"nsq.client.compress": "3"}, data) == body
    tight = b"abc" * 1000  # shrinks over 100x: the guess is too small, as for go-nsq
    data, _ = compress_body("lz4", tight)
    with pytest.raises(DecompressFailed):
        decompress_body({"nsq.client.compress": "3"}, data)


@pytest.mark.parametrize(
    "headers", [{}, {"nsq.client.compress": ""}, {"nsq.client.compress": "0"}, {"other": "2"}]
)
def test_uncompressed_bodies_pass(headers):
    assert decompress_body(headers, b"\xff\x00raw") == b"\xff\x00raw"


@pytest.mark.parametrize(
    ("headers", "body", "match"),
    [
        ({"nsq.client.compress": "9"}, b"x", "unknown compression codec"),
        ({"nsq.client.compress": "snappy"}, b"x", "decimal string"),
        ({"nsq.client.compress": 2}, b"x", "decimal string"),
        ({"nsq.client.compress": "1"}, b"not gzip", "gzip body cannot be decompressed"),
        ({"nsq.client.compress": "2"}, b"\xff" * 20, "snappy body cannot be decompressed"),
        ({"nsq.client.compress": "3", "nsq.msg.size": "10"}, b"\x00" * 8, "lz4 body"),
        ({"nsq.client.compress": "3", "nsq.msg.size": "-1"}, b"x", "decimal string"),
    ],
)
def test_bad_bodies_raise_decompress_failed(headers, body, match):
    with pytest.raises(DecompressFailed, match=match):
        decompress_body(headers, body)


def test_lz4_block_declared_too_small_fails():
    body = b"abc" * 1000
    data, _ = compress_body("lz4", body)
    with pytest.raises(DecompressFailed):
        decompress_body({"nsq.client.compress": "3", "nsq.msg.size": "100"}, data)


def test_unpack_replaces_the_body_or_returns_the_error():
    body = b"hello " * 100
    data, headers = compress_body("snappy", body)
    import json

    msg = RawMessage(0, 1, b"\x00" * 16, data, EXT_JSON, json.dumps(headers).encode())
    assert maybe_compressed(msg.ext)
    assert unpack(msg) is None and msg.body == body
    bad = RawMessage(0, 1, b"\x00" * 16, b"x", EXT_JSON, b'{"nsq.client.compress":"7"}')
    assert isinstance(unpack(bad), DecompressFailed) and bad.body == b"x"
    garbled = RawMessage(0, 1, b"\x00" * 16, b"x", EXT_JSON, b"{nsq.client.compress")
    assert isinstance(unpack(garbled), ProtocolError)
    assert not maybe_compressed(b'{"k":"v"}') and not maybe_compressed(None)


def test_check_codec():
    assert check_codec("lz4") == "lz4"
    with pytest.raises(InvalidArgument, match="gzip, lz4, snappy"):
        check_codec("zstd")
    with pytest.raises(InvalidType):
        check_codec(2)


def test_missing_lz4_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "lz4.block", None)  # import lz4.block now fails
    with pytest.raises(CodecUnavailable, match=r"smartnsq\[lz4\]"):
        check_codec("lz4")
    assert check_codec("lz4", used=False) == "lz4"  # not needed yet: not imported
    with pytest.raises(CodecUnavailable, match=r"smartnsq\[lz4\]"):
        decompress_body({"nsq.client.compress": "3"}, b"x")


def test_importing_smartnsq_does_not_import_lz4():
    import subprocess

    code = (
        "import smartnsq, sys; assert 'lz4' not in sys.modules and 'lz4.block' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("tag", ["a", "A-b_9", "x" * 100])
def test_valid_tags(tag):
    assert check_tag("tag", tag) == tag


@pytest.mark.parametrize("tag", ["", "x" * 101, "a b", "a/b", "é", "a\n"])
def test_invalid_tags(tag):
    with pytest.raises(InvalidTag, match="tag must be 1-100"):
        check_tag("tag", tag)


def test_tag_type_and_subscription_checks():
    with pytest.raises(InvalidType):
        check_tag("desired_tag", 5)
    with pytest.raises(TagNotSupported, match="classic nsqd"):
        check_tag_subscription("t", "a", youzan=False, ext=False)
    with pytest.raises(TagNotSupported, match="not an ext topic"):
        check_tag_subscription("t", "a", youzan=True, ext=False)
    check_tag_subscription("t", "a", youzan=True, ext=True)


def test_tag_server_errors_say_what_to_change():
    assert "drop the tag" in str(error_from_frame(b"E_TAG_NOT_SUPPORT x"))
    assert "1-100 characters" in str(error_from_frame(b"E_BAD_TAG x"))
    assert "extend=true" in str(error_from_frame(b"E_EXT_NOT_SUPPORT x", publish=True))
