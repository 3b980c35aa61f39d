"""The sans-IO HTTP/1.1 request builder and answer parser."""

import gzip
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smartnsq.protocol.http import (
    MAX_HEAD,
    HttpError,
    Response,
    ResponseParser,
    TooLarge,
    build_request,
)
from tests.helpers import chunked


def parse(data: bytes, cuts: list[int] | None = None, **options: object) -> Response:
    """Feed ``data`` in pieces, then end the connection if the parser still waits."""
    parser = ResponseParser(**options)  # type: ignore[arg-type]
    for piece in chunked(data, cuts or []):
        if (done := parser.feed(piece)) is not None:
            return done
    return parser.end()


def with_length(status: int, body: bytes, extra: str = "") -> bytes:
    return f"HTTP/1.1 {status} OK\r\n{extra}Content-Length: {len(body)}\r\n\r\n".encode() + body


def in_chunks(body: bytes, sizes: list[int]) -> bytes:
    out, pos = b"", 0
    for size in sizes:
        piece = body[pos : pos + size]
        if not piece:
            break
        out += b"%x;ext=1\r\n%s\r\n" % (len(piece), piece)
        pos += len(piece)
    if pos < len(body):
        out += b"%x\r\n%s\r\n" % (len(body) - pos, body[pos:])
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + out + b"0\r\nX-T: 1\r\n\r\n"


bodies = st.binary(max_size=2000)
cuts = st.lists(st.integers(min_value=0, max_value=3000), max_size=20)


@given(bodies, cuts)
def test_any_chunking_of_a_sized_answer_gives_its_body(body, cut):
    assert parse(with_length(200, body), cut) == Response(200, body)


@given(bodies, st.lists(st.integers(min_value=1, max_value=500), max_size=10), cuts)
def test_any_chunking_of_a_chunked_answer_gives_its_body(body, sizes, cut):
    assert parse(in_chunks(body, sizes), cut) == Response(200, body)


@given(bodies, cuts)
def test_an_answer_without_a_length_runs_to_the_end_of_the_connection(body, cut):
    assert parse(b"HTTP/1.0 200 OK\r\nServer: x\r\n\r\n" + body, cut) == Response(200, body)


@given(bodies, st.integers(min_value=0, max_value=2000), cuts)
def test_the_cap_is_exact_whatever_the_framing(body, cap, cut):
    for data in (
        with_length(200, body),
        in_chunks(body, [7, 300]),
        b"HTTP/1.1 200 OK\r\n\r\n" + body,
    ):
        if len(body) > cap:
            with pytest.raises(TooLarge):
                parse(data, cut, max_size=cap)
        else:
            assert parse(data, cut, max_size=cap).body == body


def test_a_sized_answer_is_done_without_waiting_for_the_end_of_the_connection():
    parser = ResponseParser()
    assert parser.feed(with_length(404, b"")[:-1]) is None
    assert parser.feed(b"\n") == Response(404, b"")
    assert parser.feed(b"anything after it") == Response(404, b"")  # ignored


def test_interim_answers_and_bodyless_statuses():
    assert parse(b"HTTP/1.1 100 Continue\r\n\r\n" + with_length(200, b"ok")) == (200, b"ok")
    assert parse(b"HTTP/1.1 204 No Content\r\n\r\n") == (204, b"")
    assert ResponseParser("HEAD").feed(with_length(200, b"xyz")[:-3]) == (200, b"")
    assert parse(b"HTTP/1.1 200 OK\n\n{}") == (200, b"{}")  # bare newlines


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_body_is_decoded_and_capped_decoded(encoding):
    plain = b"{}" + b" " * 5000
    packed = gzip.compress(plain) if encoding == "gzip" else zlib.compress(plain)
    data = with_length(200, packed, f"Content-Encoding: {encoding}\r\n")
    assert parse(data).body == plain
    with pytest.raises(TooLarge, match="once decompressed"):
        parse(data, max_size=len(plain) - 1)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP answer"),
        (b"HTTP/1.1 abc\r\n\r\n", "not an HTTP answer"),
        (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "bad header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc", "before the whole answer"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n", "past its size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n", "before the whole"),
        (with_length(200, b"x", "Content-Encoding: br\r\n"), "unsupported Content-Encoding"),
        (with_length(200, b"not gzip", "Content-Encoding: gzip\r\n"), "corrupt gzip"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * MAX_HEAD, "too long"),
        (b"HTTP/1.1 200 OK\r\n" + b"X: a\r\n" * (MAX_HEAD // 6), "head is too large"),
        (with_length(200, b"")[:-2] + b"X: a\r\n" * (MAX_HEAD // 6), "head is too large"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"0" * 2000, "too long"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" + b"T: 1\r\n" * 20000,
            "trailers is too large",
        ),
        (b"", "before the whole answer"),
    ],
)
def test_garbled_answers_are_errors(data, error):
    with pytest.raises(HttpError, match=error):
        parse(data)


def test_a_request_carries_its_query_headers_and_body():
    req = build_request(
        "POST", "http://[::1]:4151/channel/setoffset?x=1", {"topic": "a b"}, {"Accept": "j"}, b"v"
    )
    assert (req.host, req.port, req.tls) == ("::1", 4151, False)
    head, _, body = req.data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /channel/setoffset?x=1&topic=a+b HTTP/1.1"
    assert {"Host: [::1]:4151", "Accept: j", "Connection: close", "Content-Length: 1"} <= set(lines)
    assert body == b"v"
    get = build_request("GET", "https://lookupd")
    assert (get.port, get.tls) == (443, True)
    assert get.data.startswith(b"GET / HTTP/1.1\r\n") and b"Content-Length" not in get.data


@pytest.mark.parametrize("url", ["ftp://h:1/", "http://:1", "http://h:99999/", "h:4161"])
def test_a_bad_url_is_an_error_before_anything_is_sent(url):
    with pytest.raises(HttpError, match="bad URL"):
        build_request("GET", url)
