"""HTTP/1.1 for nsqlookupd's and nsqd's HTTP APIs, sans-IO: a request to bytes, and the
bytes of its answer to a status and a body. :mod:`smartnsq.http` runs them over a socket.

What these APIs need is little: a GET or POST with a query, and a JSON answer of a few
kilobytes read whole, within a size cap. One connection per request (``Connection:
close``), so the answer may also run to the end of the connection.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import NamedTuple
from urllib.parse import urlencode, urlsplit

from smartnsq._version import __version__

MAX_HEAD = 64 << 10
MAX_DECODED = 64 << 20  # when the caller gives no cap: bounds a decompression bomb


class HttpError(Exception):
    """No usable answer: the server could not be reached, or broke off or garbled it."""


class TooLarge(HttpError):
    """The answer's body is larger than the caller's cap."""


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
    """``method url?params``, the query appended to any ``url`` has. HttpError for a URL
    that is not ``http(s)://host[:port][/path]``."""
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
    lines = [f"{method} {target} HTTP/1.1", f"Host: {parts.netloc.rpartition('@')[2]}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    lines += [f"User-Agent: smartnsq/{__version__}", "Connection: close"]
    if body is not None or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body or b'')}")
    data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
    return Request(host, port or (443 if tls else 80), tls, data)


class ResponseParser:
    """The answer to one request: :meth:`feed` what arrives until it returns the
    response; at the end of the connection, :meth:`end`. Both raise :class:`HttpError`
    (:class:`TooLarge` once the body passes ``max_size``)."""

    def __init__(self, method: str = "GET", max_size: int | None = None) -> None:
        self.method = method
        self.max_size = max_size
        self._buf = bytearray()
        self._scan = 0  # where to look for the next line end
        self._head_size = 0  # bytes of head (then of trailers) so far
        self._status = 0
        self._headers: dict[bytes, bytes] = {}
        self._body = bytearray()
        # head | length | chunk-size | chunk-data | chunk-end | trailers | close | done
        self._state = "head"
        self._left = 0  # bytes left of the body (length) or of the chunk
        self._done: Response | None = None

    def feed(self, data: bytes) -> Response | None:
        if self._done is not None:
            return self._done
        self._buf += data
        self._run()
        return self._done

    def end(self) -> Response:
        """The connection ended: the answer, if it is whole."""
        if self._done is None and self._state == "close":
            self._finish()
        if self._done is None:
            raise HttpError("the connection ended before the whole answer")
        return self._done

    def _line(self) -> bytes | None:
        end = self._buf.find(b"\n", self._scan)
        if end < 0:
            self._scan = len(self._buf)
            if self._scan > (MAX_HEAD if self._state in ("head", "trailers") else 1024):
                raise HttpError(f"a line of the answer's {self._state} is too long")
            return None
        if self._state in ("head", "trailers"):  # many short lines must not grow them forever
            self._head_size += end + 1
            if self._head_size > MAX_HEAD:
                raise HttpError(f"the answer's {self._state} is too large")
        line = bytes(self._buf[:end]).rstrip(b"\r")
        del self._buf[: end + 1]
        self._scan = 0
        return line

    def _take(self, n: int) -> None:
        taken = min(n, len(self._buf))
        self._check(len(self._body) + taken)
        self._body += self._buf[:taken]
        del self._buf[:taken]
        self._left -= taken

    def _check(self, size: int) -> None:
        if self.max_size is not None and size > self.max_size:
            raise TooLarge(f"more than {self.max_size} bytes")

    def _run(self) -> None:
        while self._done is None:
            state = self._state
            if state == "head":
                if not self._head():
                    return
            elif state == "length":
                self._take(self._left)
                if self._left:
                    return
                self._finish()
            elif state == "close":
                self._take(len(self._buf))
                return
            elif state == "chunk-size":
                line = self._line()
                if line is None:
                    return
                field = line.split(b";", 1)[0].strip()
                try:
                    self._left = int(field, 16)
                except ValueError:
                    raise HttpError(f"bad chunk size {field[:40]!r}") from None
                if self._left < 0:
                    raise HttpError(f"bad chunk size {field[:40]!r}")
                self._check(len(self._body) + self._left)
                if self._left:
                    self._state = "chunk-data"
                else:
                    self._state = "trailers"
                    self._head_size = 0
            elif state == "chunk-data":
                self._take(self._left)
                if self._left:
                    return
                self._state = "chunk-end"
            elif state == "chunk-end":
                line = self._line()
                if line is None:
                    return
                if line:
                    raise HttpError("a chunk runs past its size")
                self._state = "chunk-size"
            elif state == "trailers":
                line = self._line()
                if line is None:
                    return
                if not line:
                    self._finish()

    def _head(self) -> bool:
        """Read the status line and headers; False until they are all there."""
        while True:
            line = self._line()
            if line is None:
                return False
            if not self._status:
                fields = line.split(None, 2)
                if len(fields) < 2 or not fields[0].startswith(b"HTTP/") or not fields[1].isdigit():
                    raise HttpError(f"not an HTTP answer: {line[:80]!r}")
                self._status = int(fields[1])
                continue
            if line:
                name, sep, value = line.partition(b":")
                if not sep:
                    raise HttpError(f"bad header line {line[:80]!r}")
                self._headers[name.strip().lower()] = value.strip()
                continue
            if 100 <= self._status < 200:  # an interim answer: the real one follows
                self._status = 0
                self._headers = {}
                continue
            break
        headers = self._headers
        if self.method == "HEAD" or self._status in (204, 304):
            self._left = 0
            self._state = "length"
        elif headers.get(b"transfer-encoding", b"").lower().endswith(b"chunked"):
            self._state = "chunk-size"
        elif (length := headers.get(b"content-length")) is not None:
            if not length.isdigit():
                raise HttpError(f"bad Content-Length {length[:40]!r}")
            self._left = int(length)
            self._check(self._left)
            self._state = "length"
        else:
            self._state = "close"
        return True

    def _finish(self) -> None:
        self._state = "done"
        body = _decoded(
            bytes(self._body), self._headers.get(b"content-encoding", b""), self.max_size
        )
        self._done = Response(self._status, body)


def _decoded(body: bytes, encoding: bytes, max_size: int | None) -> bytes:
    """Undo a Content-Encoding the server chose although asked for none; the cap counts
    the decoded size too."""
    encoding = encoding.strip().lower()
    if encoding in (b"", b"identity"):
        return body
    if encoding not in (b"gzip", b"deflate"):
        raise HttpError(f"unsupported Content-Encoding {encoding[:40]!r}")
    limit = MAX_DECODED if max_size is None else max_size
    try:
        inflate = zlib.decompressobj(wbits=31 if encoding == b"gzip" else 15)
        out = inflate.decompress(body, limit + 1)
    except zlib.error as exc:
        raise HttpError(f"corrupt {encoding.decode()} body: {exc}") from exc
    if len(out) > limit:
        raise TooLarge(f"more than {limit} bytes once decompressed")
    return out
