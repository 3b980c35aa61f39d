"""The HTTP client for lookupd and nsqd, on the event loop and blocking, against real
loopback servers (plain and TLS) that answer well, badly or not at all."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import anyio.abc
import pytest
import trustme

import smartnsq.net.http
from smartnsq.net.http import HttpClient, HttpError, TooLarge, request_blocking, tls_verify
from tests.helpers import fake_api, fake_http, http_response, unused_address


async def test_a_get_sends_its_query_and_headers_and_reads_the_answer(anyio_backend):
    heads: list[bytes] = []

    async def respond(path: str, stream: anyio.abc.ByteStream) -> None:
        heads.append(path.encode())
        await stream.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await stream.send(b'3\r\n{"a\r\n')  # the answer arrives in pieces
        await stream.send(b'4\r\n": 1\r\n1\r\n}\r\n0\r\n\r\n')

    async with fake_http(respond) as address:
        r = await HttpClient().get(f"http://{address}/lookup", {"topic": "t"}, {"Accept": "x"})
    assert r == (200, b'{"a": 1}')
    assert heads == [b"/lookup?topic=t"]


async def test_a_post_sends_its_body(anyio_backend):
    got = []

    async def respond(path: str, stream: anyio.abc.ByteStream) -> None:
        got.append(path)
        await stream.send(http_response(200, b""))

    async with fake_http(respond) as address:
        r = await HttpClient().request("POST", f"http://{address}/x", {"a": "1"}, None, b"v")
    assert r.status == 200 and got == ["/x?a=1"]


async def test_no_server_is_an_http_error(anyio_backend):
    with pytest.raises(HttpError, match="cannot connect"):
        await HttpClient().get(f"http://{unused_address()}/")


async def test_an_answer_broken_off_is_an_http_error(anyio_backend):
    async def respond(path: str, stream: anyio.abc.ByteStream) -> None:
        await stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{")

    async with fake_http(respond) as address:
        with pytest.raises(HttpError, match="before the whole answer"):
            await HttpClient().get(f"http://{address}/")


async def test_the_cap_stops_the_read(anyio_backend):
    sent = 0

    async def respond(path: str, stream: anyio.abc.ByteStream) -> None:
        nonlocal sent
        await stream.send(b"HTTP/1.1 200 OK\r\n\r\n")
        for _ in range(1000):
            await stream.send(b" " * 1024)
            sent += 1
            await anyio.sleep(0)

    async with fake_http(respond) as address:
        with pytest.raises(TooLarge):
            await HttpClient().get(f"http://{address}/", max_size=4096)
    assert sent < 1000


# TLS


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
async def tls_server(ca: trustme.CA, anyio_backend) -> AsyncIterator[str]:
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    async with fake_api(tls=server_context) as api:
        api.routes["/"] = (200, b"secret")
        yield api.address


async def test_https_checks_the_certificate(ca: trustme.CA, tls_server: str, anyio_backend):
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    r = await HttpClient(ssl_context=trusting).get(f"https://{tls_server}/")
    assert r == (200, b"secret")
    with pytest.raises(HttpError, match="CERTIFICATE_VERIFY_FAILED"):
        await HttpClient().get(f"https://{tls_server}/")  # the default trust store


def test_the_trust_store_follows_ssl_cert_file(
    ca: trustme.CA, tmp_path, monkeypatch: pytest.MonkeyPatch
):
    pem = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(pem))
    monkeypatch.setenv("SSL_CERT_FILE", str(pem))
    context = tls_verify.__wrapped__()
    assert any("Testing CA" in str(c.get("subject")) for c in context.get_ca_certs())


async def test_plain_http_never_loads_the_trust_store(
    monkeypatch: pytest.MonkeyPatch, anyio_backend
):
    asked: list[int] = []
    monkeypatch.setattr(smartnsq.net.http, "tls_verify", lambda: asked.append(1))
    with blocking_server(http_response(200, b"{}")) as address:
        assert await HttpClient().get(f"http://{address}/") == (200, b"{}")
        assert request_blocking("GET", f"http://{address}/", timeout=5) == (200, b"{}")
    assert asked == []


# blocking


def test_blocking_requests(ca: trustme.CA):
    with blocking_server(b"HTTP/1.1 201 Created\r\n\r\n{}") as address:
        assert request_blocking("PUT", f"http://{address}/a", {"b": "c"}, timeout=5) == (201, b"{}")
    with pytest.raises(HttpError, match="cannot connect"):
        request_blocking("GET", f"http://{unused_address()}/", timeout=5)
    cut_short = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{"
    with blocking_server(cut_short) as address, pytest.raises(HttpError, match="before the whole"):
        request_blocking("GET", f"http://{address}/", timeout=5)
    with blocking_server(None) as address, pytest.raises(HttpError, match=r"within 0\.2s"):
        request_blocking("GET", f"http://{address}/", timeout=0.2)


def test_blocking_https(ca: trustme.CA):
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    with blocking_server(http_response(200, b"secret"), tls=server_context) as address:
        url = f"https://{address}/"
        assert request_blocking("GET", url, timeout=5, ssl_context=trusting) == (200, b"secret")
        with pytest.raises(HttpError, match="CERTIFICATE_VERIFY_FAILED"):
            request_blocking("GET", url, timeout=5)


@contextmanager
def blocking_server(answer: bytes | None, tls: ssl.SSLContext | None = None) -> Iterator[str]:
    """A one-thread server: each client gets ``answer`` once its request's head is in
    (None: nothing, the connection stays open until the block ends)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    conns: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conns.append(conn)
            try:
                if tls is not None:
                    conn = tls.wrap_socket(conn, server_side=True)
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    head += chunk
                if answer is not None:
                    conn.sendall(answer)
                    conn.close()
            except OSError:  # a client that refused the certificate
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept()
        listener.close()
        for conn in conns:
            conn.close()
        thread.join(5)


def test_blocking_connect_and_tls_get_the_time_left(monkeypatch: pytest.MonkeyPatch):
    """A slow name look-up leaves less time for the handshake, not a fresh timeout (it was
    the full timeout for connect and again for TLS, so the whole took up to twice it)."""
    real_getaddrinfo = socket.getaddrinfo

    def slow_getaddrinfo(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.8)
        return real_getaddrinfo(*args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow_getaddrinfo)
    with blocking_server(None) as address:  # accepts, never answers the TLS handshake
        started = time.monotonic()
        with pytest.raises(HttpError, match=r"within 1\.0s"):
            request_blocking("GET", f"https://{address}/", timeout=1.0)
        elapsed = time.monotonic() - started
    assert elapsed < 1.5, elapsed  # was 1.8: 0.8 s look-up, then 1.0 s more for TLS


def test_the_trust_store_is_the_systems_even_with_certifi_installed(
    monkeypatch: pytest.MonkeyPatch,
):
    import certifi  # installed here (by other packages): it must not change what is trusted

    assert certifi.where()
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    ours = tls_verify.__wrapped__().get_ca_certs()
    assert ours == ssl.create_default_context().get_ca_certs()


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", "conflicting"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\n{}\r\n0\r\n\r\n", "chunk"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: xchunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", "chunked"),
        (b"HTTP/1.1 20 OK\r\nContent-Length: 2\r\n\r\n{}", "status line"),
    ],
)
def test_a_malformed_answer_is_an_http_error_on_both_clients(answer: bytes, error: str):
    async def ask(address: str) -> None:
        await HttpClient().get(f"http://{address}/")

    with blocking_server(answer) as address:
        with pytest.raises(HttpError, match=error):
            anyio.run(ask, address)
        with pytest.raises(HttpError, match=error):
            request_blocking("GET", f"http://{address}/", timeout=5)


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/lookup\u65e5\u672c", None),  # was a bare UnicodeEncodeError
        ("/lookup\r\nX-Injected: 1", None),
        ("/lookup", {"Accept": "x\r\nX-Injected: 1"}),
        ("/lookup", {"Accept": "\u00e9"}),
    ],
)
async def test_a_bad_request_is_refused_before_anything_is_sent(
    path: str, headers: dict[str, str] | None, anyio_backend
):
    async with fake_api() as api:
        with pytest.raises(HttpError, match="bad"):
            await HttpClient().get(f"{api.url}{path}", headers=headers)
        with pytest.raises(HttpError, match="bad"):
            request_blocking("GET", f"{api.url}{path}", headers=headers, timeout=5)
        assert api.requests == []


def test_h11_is_loaded_by_the_first_request_not_by_the_clients_imports():
    # a Producer given nsqd addresses only never makes an HTTP request
    probe = (
        "import sys; import smartnsq.sync; from smartnsq import Consumer, Producer; "
        "before = 'h11' in sys.modules; "
        "from smartnsq.protocol.http import build_request; build_request('GET', 'http://h/'); "
        "print(before, 'h11' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
