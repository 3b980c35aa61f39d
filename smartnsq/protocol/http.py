"""HTTP/1.1 for nsqlookupd's and nsqd's HTTP APIs, sans-IO, on h11: a request to bytes, and
the bytes of its answer to a status and a body. :mod:`smartnsq.net.http` runs them over a socket.

What these APIs need is little: a GET or POST with a query, and a JSON answer of a few
kilobytes read whole, within a size cap. One connection per request (``Connection:
close``), so the answer may also run to the end of the connection.

h11 does the framing and refuses what a strict parser refuses (conflicting
``Content-Length``, chunk sizes that are not plain hex, unknown ``Transfer-Encoding``,
malformed header lines and status lines). This layer adds what h11 leaves to its user: the
checks on what is sent, the caps on the body (received and decoded) and on interim (1xx)
answers, and decoding a ``Content-Encoding``.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import urlencode, urlsplit

from smartnsq._version import __version__

if TYPE_CHECKING:
    import h11

# h11 is imported by the first request, not with this module: every Producer and Consumer
# imports it, and one given nsqd addresses only never makes an HTTP request.

MAX_HEAD = 64 << 10  # the status line and headers of one answer, and the trailers
MAX_INTERIM = 8  # 1xx answers before the real one; h11 takes any number
MAX_DECODED = 64 << 20  # when the caller gives no cap: bounds a decompression bomb

# What may appear in a URL: printable ASCII, no space. Anything else (CR, LF, NUL, a
# non-ASCII letter) is refused rather than quoted: these URLs are built from addresses and
# names that the rest of the client already checked, so a stray byte means a bug or an
# injection attempt, not a name to percent-encode.
_URL = re.compile(r"[\x21-\x7e]+")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VALUE = re.compile(r"[\x20-\x7e\t]*")


class HttpError(Exception):
    """No usable answer: the server could not be reached, or broke off or garbled it; or
    the request itself could not be sent as asked (then nothing was sent)."""


class TooLarge(HttpError):
    """The answer's body is larger than the caller's cap."""


class _Malformed(HttpError):
    """What h11 refused (its error is the cause)."""


class Response(NamedTuple):
    status: int
    body: bytes


class Request(NamedTuple):
    """Where to connect and what to send."""

    host: str
    port: int
    tls: bool
    data: bytes


def build_request(
    method: str,
    url: str,
    params: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
) -> Request:
    """``method url?params``, the query appended to any ``url`` has. HttpError, before
    anything is sent, for a URL that is not ``http(s)://host[:port][/path]`` in printable
    ASCII, and for a method or header that HTTP cannot carry (CR, LF, non-ASCII)."""
    # urlsplit silently drops tabs and newlines from a URL; refuse them before it can.
    if not isinstance(url, str) or not _URL.fullmatch(url):
        raise HttpError(f"bad URL {url!r}: only printable ASCII, no spaces or line breaks")
    if not isinstance(method, str) or not _TOKEN.fullmatch(method):
        raise HttpError(f"bad method {method!r}")
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise HttpError(f"bad URL {url!r}: {exc}") from exc
    if parts.scheme not in ("http", "https") or not host:
        raise HttpError(f"bad URL {url!r}: need http(s)://host[:port]")
    tls = parts.scheme == "https"
    target = parts.path or "/"
    query = "&".join(q for q in (parts.query, urlencode(params or {})) if q)
    if query:
        target += "?" + query
    fields = [("Host", parts.netloc.rpartition("@")[2])]
    fields += list((headers or {}).items())
    if not any(str(name).lower() == "user-agent" for name, _ in fields):
        fields.append(("User-Agent", f"smartnsq/{__version__}"))
    fields.append(("Connection", "close"))
    if body is not None or method in ("POST", "PUT"):
        fields.append(("Content-Length", str(len(body or b""))))
    for name, value in fields:
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise HttpError(f"bad header name {name!r}")
        if not isinstance(value, str) or not _VALUE.fullmatch(value):
            raise HttpError(f"bad value for header {name}: {value!r} (printable ASCII only)")
    import h11

    conn = h11.Connection(h11.CLIENT)
    try:
        data = conn.send(h11.Request(method=method, target=target, headers=fields)) or b""
        if body:
            data += conn.send(h11.Data(data=body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
    except h11.LocalProtocolError as exc:  # what the checks above did not foresee
        raise HttpError(f"cannot send {method} {url!r}: {exc}") from None
    return Request(host, port or (443 if tls else 80), tls, data)


class ResponseParser:
    """The answer to one request: :meth:`feed` what arrives until it returns the
    response; at the end of the connection, :meth:`end`. Both raise :class:`HttpError`
    (:class:`TooLarge` once the body passes ``max_size``)."""

    def __init__(self, method: str = "GET", max_size: int | None = None) -> None:
        import h11

        self.max_size = max_size
        self._conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
        # h11 frames an answer by the request it answers (HEAD has no body): tell it.
        self._conn.send(h11.Request(method=method, target="/", headers=[("Host", "-")]))
        self._conn.send(h11.EndOfMessage())
        self._status = 0
        self._encoding = b""
        self._interim = 0
        self._body = bytearray()
        self._done: Response | None = None

    def feed(self, data: bytes) -> Response | None:
        if self._done is None and data:
            self._conn.receive_data(data)
            try:
                self._run()
            except HttpError:
                self._body = bytearray()  # the error's traceback must not keep it alive
                raise
        return self._done

    def end(self) -> Response:
        """The connection ended: the answer, if it is whole."""
        if self._done is None:
            self._conn.receive_data(b"")
            try:
                self._run()
            except HttpError as exc:
                self._body = bytearray()
                if not isinstance(exc, _Malformed):
                    raise
                part = "answer" if self._status else "answer's head"
                raise HttpError(
                    f"the connection ended before the whole {part} ({exc.__cause__})"
                ) from None
        if self._done is None:
            raise HttpError("the connection ended before the whole answer")
        return self._done

    def _run(self) -> None:
        import h11

        while self._done is None:
            try:
                event = self._conn.next_event()
            except h11.RemoteProtocolError as exc:
                if str(exc) == "Receive buffer too long":  # h11's max_incomplete_event_size
                    raise _Malformed(
                        f"malformed answer: its head, a chunk line or the trailers pass "
                        f"{MAX_HEAD} bytes"
                    ) from exc
                raise _Malformed(f"malformed answer: {exc}") from exc
            if event is h11.NEED_DATA or isinstance(event, h11.ConnectionClosed):
                return
            if isinstance(event, h11.InformationalResponse):
                self._interim += 1
                if self._interim > MAX_INTERIM:
                    raise HttpError(f"more than {MAX_INTERIM} interim (1xx) answers")
            elif isinstance(event, h11.Response):
                self._head(event)
            elif isinstance(event, h11.Data):
                self._check(len(self._body) + len(event.data))
                self._body += event.data
            elif isinstance(event, h11.EndOfMessage):
                body = _decoded(bytes(self._body), self._encoding, self.max_size)
                self._done = Response(self._status, body)
            else:  # PAUSED: only after a whole answer, which ends the loop first
                raise HttpError(f"unexpected {event!r:.80} in the answer")

    def _head(self, event: h11.Response) -> None:
        self._status = event.status_code
        for name, value in event.headers:
            if name == b"content-encoding":
                self._encoding = value
            elif name == b"content-length":  # h11 checked it is one number
                self._check(int(value))

    def _check(self, size: int) -> None:
        if self.max_size is not None and size > self.max_size:
            raise TooLarge(f"more than {self.max_size} bytes")


def _decoded(body: bytes, encoding: bytes, max_size: int | None) -> bytes:
    """Undo a Content-Encoding the server chose although asked for none; the cap counts
    the decoded size too, and a stream cut short is an error, not a shorter body."""
    encoding = encoding.strip().lower()
    if encoding in (b"", b"identity"):
        return body
    if encoding not in (b"gzip", b"deflate"):
        raise HttpError(f"unsupported Content-Encoding {encoding[:40]!r}")
    name = encoding.decode()
    limit = MAX_DECODED if max_size is None else max_size
    try:
        inflate = zlib.decompressobj(wbits=31 if encoding == b"gzip" else 15)
        out = inflate.decompress(body, limit + 1)
    except zlib.error as exc:
        raise HttpError(f"corrupt {name} body: {exc}") from exc
    if len(out) > limit:
        raise TooLarge(f"more than {limit} bytes once decompressed")
    if not inflate.eof:
        raise HttpError(f"truncated {name} body: the compressed stream does not end")
    if inflate.unused_data:
        raise HttpError(f"corrupt {name} body: bytes after the end of the compressed stream")
    return out
