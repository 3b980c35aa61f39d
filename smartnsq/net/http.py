"""HTTP requests to nsqlookupd and nsqd (:mod:`smartnsq.protocol.http` over a socket):
:class:`HttpClient` on the event loop, :func:`request_blocking` for plain threads (the
Spark source).

Every Consumer and Producer asks a lookupd before its first message, so this is on the
start-up path: importing httpx and building its client took 30-40 ms of each start, longer
than the rest of it together. Environment proxies are not used (as with go-nsq): these are
cluster-internal addresses.
"""

from __future__ import annotations

import functools
import os
import socket
import ssl
import time
from collections.abc import Callable, Mapping

import anyio
import anyio.abc

from smartnsq.protocol.http import (
    HttpError,
    Request,
    Response,
    ResponseParser,
    TooLarge,
    build_request,
)

__all__ = ["HttpClient", "HttpError", "Response", "TooLarge", "request_blocking", "tls_verify"]

_READ = 65536


@functools.cache
def tls_verify() -> ssl.SSLContext:
    """The certificate check for ``https://`` URLs, built once per process (loading the
    trust store takes 20-40 ms): the system's trust store, as for nsqd's TLS, or the one
    ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` name instead. Never certifi's, even when installed:
    one trust store, whatever else happens to be in the environment."""
    cafile, capath = os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")
    return ssl.create_default_context(cafile=cafile or None, capath=capath or None)


class HttpClient:
    """Requests on the event loop, one connection each. ``ssl_context``: for ``https://``
    URLs (default: :func:`tls_verify`); ``connect_timeout`` bounds a connection's set-up.
    Callers bound the whole request themselves (``anyio.move_on_after``)."""

    def __init__(
        self, *, connect_timeout: float = 2.0, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.connect_timeout = connect_timeout
        self.ssl_context = ssl_context

    async def get(
        self,
        url: str,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        *,
        max_size: int | None = None,
    ) -> Response:
        return await self.request("GET", url, params, headers, max_size=max_size)

    async def request(
        self,
        method: str,
        url: str,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        *,
        max_size: int | None = None,
    ) -> Response:
        """``method url?params``: the status and the whole body. Raises :class:`HttpError`
        (:class:`TooLarge` past ``max_size`` bytes)."""
        req = build_request(method, url, params, headers, body)
        stream = await self._connect(req)
        parser = ResponseParser(method, max_size)
        try:
            async with stream:
                await stream.send(req.data)
                while True:
                    try:
                        data = await stream.receive(_READ)
                    except anyio.EndOfStream:
                        return parser.end()
                    if (response := parser.feed(data)) is not None:
                        return response
        except (OSError, anyio.BrokenResourceError) as exc:
            raise HttpError(f"{req.host}:{req.port} broke off its answer: {exc!r}") from exc

    async def _connect(self, req: Request) -> anyio.abc.ByteStream:
        try:
            with anyio.fail_after(self.connect_timeout):
                if req.tls:
                    return await anyio.connect_tcp(
                        req.host,
                        req.port,
                        ssl_context=self.ssl_context or tls_verify(),
                        tls_hostname=req.host,
                        tls_standard_compatible=False,
                    )
                return await anyio.connect_tcp(req.host, req.port)
        except (OSError, anyio.BrokenResourceError) as exc:  # TimeoutError is an OSError
            raise HttpError(f"cannot connect to {req.host}:{req.port}: {exc!r}") from exc


def request_blocking(
    method: str,
    url: str,
    params: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    *,
    timeout: float,
    max_size: int | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> Response:
    """:meth:`HttpClient.request` for a plain thread; ``timeout`` bounds the whole request:
    connecting, the TLS handshake, sending and reading each get the time that is left."""
    req = build_request(method, url, params, headers, body)
    deadline = time.monotonic() + timeout
    parser = ResponseParser(method, max_size)

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        return remaining

    try:
        sock = _connect(req.host, req.port, left)
    except TimeoutError:
        raise HttpError(f"cannot connect to {req.host}:{req.port} within {timeout}s") from None
    except OSError as exc:
        raise HttpError(f"cannot connect to {req.host}:{req.port}: {exc!r}") from exc
    try:
        if req.tls:
            context = ssl_context or tls_verify()
            sock.settimeout(left())  # the handshake runs under the socket's timeout
            sock = context.wrap_socket(sock, server_hostname=req.host)
        with sock:
            sock.settimeout(left())
            sock.sendall(req.data)
            while True:
                sock.settimeout(left())
                data = sock.recv(_READ)
                if not data:
                    return parser.end()
                if (response := parser.feed(data)) is not None:
                    return response
    except TimeoutError:
        raise HttpError(f"{req.host}:{req.port} did not answer within {timeout}s") from None
    except OSError as exc:
        raise HttpError(f"{req.host}:{req.port} broke off its answer: {exc!r}") from exc
    finally:
        sock.close()


def _connect(host: str, port: int, left: Callable[[], float]) -> socket.socket:
    """``socket.create_connection``, but each address tried gets the time left of the
    whole request, not a fresh timeout each (nor one more for the name look-up)."""
    first: OSError | None = None
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(left())
            sock.connect(address)
        except TimeoutError:
            sock.close()
            raise
        except OSError as exc:
            sock.close()
            first = first or exc
        else:
            return sock
    raise first or OSError(f"no address for {host!r}")
