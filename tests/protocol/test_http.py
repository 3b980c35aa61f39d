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


CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
GZIP_CUT = gzip.compress(b"{}" * 1000)[:-10]
DEFLATE_CUT = zlib.compress(b"{}" * 1000)[:-6]

# Answers a strict parser refuses. The hand-written parser before h11 accepted the ones
# marked "issue 26" (taking the last Content-Length, int(x, 16) for chunk sizes, a suffix
# match on Transfer-Encoding, stripping around the colon, a truncated compressed body).
MALFORMED = [
    pytest.param(
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        "conflicting Content-Length",
        id="two-content-lengths",  # issue 26
    ),
    pytest.param(CHUNKED + b"0x3\r\nabc\r\n0\r\n\r\n", "chunk header", id="chunk-0x3"),
    pytest.param(CHUNKED + b"+3\r\nabc\r\n0\r\n\r\n", "chunk header", id="chunk-+3"),
    pytest.param(
        CHUNKED + b"1_0\r\n" + b"a" * 16 + b"\r\n0\r\n\r\n", "chunk header", id="chunk-1_0"
    ),
    pytest.param(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: xchunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        "Transfer-Encoding",
        id="xchunked",
    ),
    pytest.param(
        b"HTTP/1.1 200 OK\r\nContent-Length : 3\r\n\r\nabc", "header line", id="space-before-colon"
    ),
    pytest.param(
        b"HTTP/1.1 200 OK\r\nX: a\rb\r\nContent-Length: 3\r\n\r\nabc",
        "header line",
        id="bare-cr-in-header",
    ),
    pytest.param(b"HTTP/1.1 20 OK\r\nContent-Length: 0\r\n\r\n", "status line", id="status-20"),
    pytest.param(b"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n", "status line", id="status-2000"),
    pytest.param(b"HTTP/1.1 2OO OK\r\nContent-Length: 0\r\n\r\n", "status line", id="status-2OO"),
    pytest.param(
        with_length(200, GZIP_CUT, "Content-Encoding: gzip\r\n"), "truncated gzip", id="gzip-cut"
    ),
    pytest.param(
        with_length(200, DEFLATE_CUT, "Content-Encoding: deflate\r\n"),
        "truncated deflate",
        id="deflate-cut",
    ),
    pytest.param(
        with_length(200, gzip.compress(b"{}") + b"junk", "Content-Encoding: gzip\r\n"),
        "after the end",
        id="gzip-trailing-junk",
    ),
    pytest.param(
        b"HTTP/1.1 103 Early Hints\r\n\r\n" * 9 + with_length(200, b"{}"), "interim", id="1xx-flood"
    ),
    pytest.param(
        b"HTTP/1.1 101 Switching\r\n\r\n" + with_length(200, b"{}"), "malformed", id="unasked-101"
    ),
    # these the old parser refused as well
    pytest.param(b"SSH-2.0-OpenSSH\r\n\r\n", "status line", id="not-http"),
    pytest.param(b"HTTP/1.1 abc\r\n\r\n", "status line", id="no-status"),
    pytest.param(b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "header line", id="no-colon"),
    pytest.param(
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "Content-Length", id="length--1"
    ),
    pytest.param(
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc",
        "before the whole answer",
        id="cut-short",
    ),
    pytest.param(CHUNKED + b"zz\r\n", "chunk header", id="chunk-zz"),
    pytest.param(CHUNKED + b"2\r\nabc\r\n", "chunk footer", id="chunk-overrun"),
    pytest.param(CHUNKED + b"2\r\nab\r\n", "before the whole answer", id="chunks-cut"),
    pytest.param(
        with_length(200, b"x", "Content-Encoding: br\r\n"), "unsupported Content-Encoding", id="br"
    ),
    pytest.param(
        with_length(200, b"not gzip", "Content-Encoding: gzip\r\n"), "corrupt gzip", id="not-gzip"
    ),
    pytest.param(
        b"HTTP/1.1 200 OK\r\nX: " + b"a" * MAX_HEAD, f"pass {MAX_HEAD} bytes", id="long-line"
    ),
    pytest.param(
        b"HTTP/1.1 200 OK\r\n" + b"X: a\r\n" * (MAX_HEAD // 6), f"pass {MAX_HEAD}", id="long-head"
    ),
    pytest.param(
        with_length(200, b"")[:-2] + b"X: a\r\n" * (MAX_HEAD // 6),
        f"pass {MAX_HEAD}",
        id="long-head-2",
    ),
    pytest.param(CHUNKED + b"0" * 2000, "chunk header|before the whole", id="long-chunk-size"),
    pytest.param(CHUNKED + b"0\r\n" + b"T: 1\r\n" * 20000, f"pass {MAX_HEAD}", id="long-trailers"),
    pytest.param(b"", "before the whole answer's head", id="nothing"),
]


@pytest.mark.parametrize(("data", "error"), MALFORMED)
def test_malformed_answers_are_http_errors(data, error):
    with pytest.raises(HttpError, match=error):
        parse(data)


@given(st.data())
def test_malformed_answers_are_errors_however_they_arrive(data):
    answer, error = data.draw(st.sampled_from([(p.values[0], p.values[1]) for p in MALFORMED]))
    with pytest.raises(HttpError, match=error):
        parse(answer, data.draw(cuts))


def test_up_to_eight_interim_answers_are_passed_over():
    interim = b"HTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\n" * 8
    assert parse(interim + with_length(200, b"{}")) == (200, b"{}")


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


@pytest.mark.parametrize(
    "url",
    [
        "ftp://h:1/",
        "http://:1",
        "http://h:99999/",
        "h:4161",
        "http://h:1/lookup\r\nX-Injected: 1",
        "http://h:1/a\nb",
        "http://h\t:1/",  # urlsplit would drop the tab and ask another host
        "http://h:1/a b",
        "http://h:1/\x00",
        "http://h:1/caf\u00e9",  # Latin-1, still not ASCII
        "http://h:1/\u65e5\u672c",  # not even Latin-1 (was a bare UnicodeEncodeError)
        "http://b\u00fccher:1/",
        "",
    ],
)
def test_a_bad_url_is_an_error_before_anything_is_sent(url):
    with pytest.raises(HttpError, match="bad URL"):
        build_request("GET", url)


@pytest.mark.parametrize(
    ("method", "headers"),
    [
        ("GET", {"X": "a\r\nX-Injected: 1"}),
        ("GET", {"X": "a\nb"}),
        ("GET", {"X": "a\rb"}),
        ("GET", {"X": "\x00"}),
        ("GET", {"X": "\u65e5"}),
        ("GET", {"X\r\nY": "1"}),
        ("GET", {"X Y": "1"}),
        ("GET", {"": "1"}),
        ("GET\r\n", {}),
        ("G T", {}),
        ("", {}),
    ],
)
def test_a_bad_method_or_header_is_an_error_before_anything_is_sent(method, headers):
    with pytest.raises(HttpError, match="bad"):
        build_request(method, "http://h:1/", headers=headers)


@given(st.text(max_size=20), st.text(max_size=20))
def test_a_header_is_sent_as_given_or_refused(name, value):
    try:
        req = build_request("GET", "http://h:1/", headers={name: value})
    except HttpError:
        return
    head = req.data.split(b"\r\n\r\n")[0].split(b"\r\n")
    assert f"{name}: {value.strip()}".encode() in head or f"{name}: {value}".encode() in head


@given(st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=3))
def test_any_query_is_percent_encoded(params):
    req = build_request("GET", "http://h:1/lookup", params)
    line = req.data.split(b"\r\n")[0]
    assert line.isascii() and len(line.split(b" ")) == 3


@pytest.mark.parametrize("name", ["User-Agent", "user-agent"])
def test_a_user_agent_given_replaces_the_clients_own(name):
    head = build_request("GET", "http://h/x", headers={name: "nsq_to_http/1.3"}).data.lower()
    assert head.count(b"user-agent:") == 1
    assert b"user-agent: nsq_to_http/1.3\r\n" in head
    assert build_request("GET", "http://h/x").data.lower().count(b"user-agent: smartnsq/") == 1
