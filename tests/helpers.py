"""Helpers shared by the tests: polling and inspection of real servers, byte chunking, a tiny
fake HTTP server for hostile behaviour no real server shows."""

from __future__ import annotations

import http.server
import json
import random
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.abc
import pytest
from anyio.streams.tls import TLSListener

from smartnsq import Connection, ConnectionConfig
from smartnsq.protocol import RawMessage, commands, decode_message
from smartnsq.protocol.message import MessageLayout

T = TypeVar("T")

# asyncio with uvloop's event loop: its transports are not asyncio.Transport subclasses
UVLOOP = pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")
EVERY_LOOP = pytest.mark.parametrize("anyio_backend", ["asyncio", "trio", UVLOOP])


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the given points (taken modulo its length + 1); may hold empty chunks."""
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for p in [*points, len(data)]:
        out.append(data[prev:p])
        prev = p
    return out


def unique(prefix: str) -> str:
    """A fresh topic (or channel) name for one test."""
    return f"{prefix}_{random.getrandbits(40):x}"


def lookupds(cluster: Any) -> list[str]:
    """The HTTP addresses of a compat cluster's lookupds."""
    return [d.http for d in cluster.lookupd]


def http_json(url: str, method: str = "GET") -> Any:
    req = urllib.request.Request(
        url, method=method, headers={"Accept": "application/vnd.nsq; version=1.0"}
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        body = resp.read()
    return json.loads(body) if body else None


def listed_producers(lookupd_http: str, topic: str) -> list[dict[str, Any]]:
    """The producers a lookupd lists for ``topic``; none while it still answers 404.

    nsqd registers a new topic with its lookupds a moment after creating it, and nsqlookupd
    answers 404 for a topic it does not know yet, so a test waiting for registration polls this.
    """
    try:
        answer = http_json(f"http://{lookupd_http}/lookup?topic={topic}")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return []
        raise
    return list(answer.get("producers") or [])


def start_tls_cluster(
    ca: Any, directory: Path, *nsqd_args: str, names: tuple[str, ...] = ()
) -> Any:
    """A classic cluster of one nsqd that takes only TLS on TCP (plain HTTP stays, for stats
    and readiness checks), its certificate for 127.0.0.1 (and ``names``) signed by the trustme
    ``ca``, whose own certificate is written to ``directory / "ca.pem"``. The caller stops it."""
    from compat.cluster import Cluster

    cert = ca.issue_cert("127.0.0.1", "localhost", *names)
    cert.private_key_pem.write_to_path(str(directory / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(directory / "cert.pem"))
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    return Cluster.start(
        kind="classic",
        dir=directory / "cluster",
        nsqd=1,
        nsqd_args=[
            f"--tls-cert={directory / 'cert.pem'}",
            f"--tls-key={directory / 'key.pem'}",
            "--tls-required=tcp-https",
            *nsqd_args,
        ],
    )


def topic_stats(nsqd_http: str, topic: str) -> dict[str, Any] | None:
    stats = http_json(f"http://{nsqd_http}/stats?format=json&topic={topic}")
    for t in stats.get("topics") or []:
        if t["topic_name"] == topic:
            return t
    return None


def channel_stats(nsqd_http: str, topic: str, channel: str) -> dict[str, Any] | None:
    t = topic_stats(nsqd_http, topic)
    for c in (t or {}).get("channels") or []:
        if c["channel_name"] == channel:
            return c
    return None


def settled(http: str, topic: str, channel: str, count: int) -> bool:
    """All ``count`` messages reached the channel and none is waiting or in flight.

    The channel's own message_count, not just depth 0: a channel shows depth 0 before nsqd
    moved the topic's messages into it.
    """
    s = channel_stats(http, topic, channel) or {}
    return (
        s.get("message_count") == count
        and s.get("depth") == 0
        and s.get("in_flight_count") == 0
        and s.get("deferred_count") == 0
    )


def create_channel(nsqd_http: str, topic: str, channel: str) -> None:
    http_json(f"http://{nsqd_http}/topic/create?topic={topic}", "POST")
    http_json(f"http://{nsqd_http}/channel/create?topic={topic}&channel={channel}", "POST")


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, what: str = "condition") -> T:
    """Poll ``predicate`` until it returns something truthy, or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: T = predicate()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
        time.sleep(0.05)
        last = predicate()
    return last


async def drain(
    nsqd_tcp: str,
    topic: str,
    channel: str,
    count: int,
    *,
    timeout: float = 20.0,
    layout: MessageLayout | None = None,
    sub: bytes | None = None,
    distinct: bool = False,
    until: Callable[[list[RawMessage]], bool] | None = None,
    config: ConnectionConfig | None = None,
) -> list[RawMessage]:
    """Read ``count`` messages with a bare connection (SUB + RDY + FIN), independent of Consumer.

    With ``distinct``, count distinct message ids (redeliveries are returned but not counted).
    With ``until``, stop when it returns true for the messages so far (``count`` sets RDY).
    """
    conn = await Connection.open(nsqd_tcp, config or ConnectionConfig())
    got: list[RawMessage] = []
    ids: set[bytes] = set()
    done = anyio.Event()
    lay = layout or MessageLayout(binary_id=conn.features.youzan)

    def on_messages(src: bytes, spans: list[tuple[int, int, int]]) -> None:
        for _, start, end in spans:
            msg = decode_message(src[start:end], lay, RawMessage)
            got.append(msg)
            ids.add(msg.id)
            conn.queue(commands.fin(msg.id))
            if until is not None:
                if until(got):
                    done.set()
            elif (len(ids) if distinct else len(got)) >= count:
                done.set()

    conn.on_messages = on_messages
    async with anyio.create_task_group() as tg:
        tg.start_soon(conn.run)
        await conn.request(sub or commands.sub(topic, channel))
        await conn.send(commands.rdy(min(2500, max(count, 1))))
        with anyio.fail_after(timeout):
            await done.wait()
        await conn.close(timeout=1)
    return got


async def wait_until(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    what: str = "condition",
    describe: Callable[[], Any] | None = None,
) -> T:
    """Async :func:`wait_for`: poll ``predicate`` without blocking the event loop.

    ``describe`` (optional) is called on timeout and its result added to the error.
    """
    deadline = time.monotonic() + timeout
    last: T = predicate()
    while not last:
        if time.monotonic() > deadline:
            extra = f"; state: {describe()!r}" if describe is not None else ""
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what} (last: {last!r}){extra}"
            )
        await anyio.sleep(0.05)
        last = predicate()
    return last


# respond(path with query, stream): write the raw HTTP answer; the connection closes after it.
Responder = Callable[[str, anyio.abc.ByteStream], Awaitable[None]]


@asynccontextmanager
async def fake_http(respond: Responder) -> AsyncIterator[str]:
    """An HTTP server on 127.0.0.1 that hands each request's path to ``respond``.

    Yields its ``host:port``; every connection is cut when the block ends.
    """
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def handle(stream: anyio.abc.ByteStream) -> None:
        async with stream:
            try:
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    head += await stream.receive()
                path = head.split(b" ", 2)[1].decode("latin-1")
                await respond(path, stream)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
                pass  # the client hung up: what hostile servers are for

    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        try:
            yield f"127.0.0.1:{port}"
        finally:
            tg.cancel_scope.cancel()


@asynccontextmanager
async def fake_nsqd(reply: bytes) -> AsyncIterator[str]:
    """A TCP server on loopback that answers every client's IDENTIFY with a response frame
    carrying ``reply`` and then stays silent. Yields its ``host:port``."""
    from tests.fakes import fake_server, identify_reply

    async with fake_server(identify_reply(reply)) as address:
        yield address


def http_response(status: int, body: bytes, content_type: str = "application/json") -> bytes:
    """A complete HTTP/1.1 answer with a Content-Length."""
    return (
        f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


@dataclass
class HttpRequest:
    """One request a fake HTTP API received."""

    method: str
    path: str  # without the query
    query: dict[str, str]
    headers: dict[str, str]  # names in lower case
    body: bytes


# What a path answers: (status, body), or a coroutine that writes the raw answer itself
# (slowly, endlessly, or not at all); the connection closes after it.
Route = tuple[int, bytes] | Callable[[HttpRequest, anyio.abc.ByteStream], Awaitable[None]]
NOT_FOUND = (404, b'{"message":"NOT_FOUND"}')  # what nsqd and nsqlookupd answer unknown paths


def json_body(data: Any, status: int = 200) -> tuple[int, bytes]:
    return status, json.dumps(data).encode()


class FakeApi:
    """A fake lookupd or nsqd HTTP API: ``routes`` maps a path to its :data:`Route` (any
    other path: :data:`NOT_FOUND`); every request is kept in ``requests``."""

    def __init__(self, address: str) -> None:
        self.address = address  # host:port
        self.url = f"http://{address}"
        self.routes: dict[str, Route] = {}
        self.requests: list[HttpRequest] = []

    def calls(self, path: str) -> list[HttpRequest]:
        return [r for r in self.requests if r.path == path]


def parse_request(head: bytes, body: bytes) -> HttpRequest:
    """A request from its head (up to the blank line) and its body."""
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    path, _, query = target.partition("?")
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return HttpRequest(method, path, dict(urllib.parse.parse_qsl(query)), headers, body)


@asynccontextmanager
async def fake_api(tls: ssl.SSLContext | None = None) -> AsyncIterator[FakeApi]:
    """A :class:`FakeApi` on 127.0.0.1 (``tls``: HTTPS with that server context); every
    connection is cut when the block ends."""
    tcp = await anyio.create_tcp_listener(local_host="127.0.0.1")
    api = FakeApi(f"127.0.0.1:{tcp.extra(anyio.abc.SocketAttribute.local_port)}")
    listener: anyio.abc.Listener[Any] = tcp if tls is None else TLSListener(tcp, tls, False)

    async def handle(stream: anyio.abc.ByteStream) -> None:
        async with stream:
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += await stream.receive()
                head, _, body = data.partition(b"\r\n\r\n")
                request = parse_request(head, body)
                while len(request.body) < int(request.headers.get("content-length", 0)):
                    request.body += await stream.receive()
                api.requests.append(request)
                route = api.routes.get(request.path, NOT_FOUND)
                if isinstance(route, tuple):
                    await stream.send(http_response(*route))
                else:
                    await route(request, stream)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
                pass  # the client hung up

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        try:
            yield api
        finally:
            tg.cancel_scope.cancel()


async def hang_up(request: HttpRequest, stream: anyio.abc.ByteStream) -> None:
    """A route that closes the connection without a word."""


async def never_answer(request: HttpRequest, stream: anyio.abc.ByteStream) -> None:
    await anyio.sleep_forever()


def later(delay: float, route: tuple[int, bytes]) -> Route:
    """A route that answers after ``delay`` seconds: a slow server."""

    async def respond(request: HttpRequest, stream: anyio.abc.ByteStream) -> None:
        await anyio.sleep(delay)
        await stream.send(http_response(*route))

    return respond


def drip(size: int, pause: float) -> Route:
    """A route whose 200 body of ``size`` spaces comes one byte every ``pause`` seconds:
    each read is quick, only a deadline for the whole answer ends it."""

    async def respond(request: HttpRequest, stream: anyio.abc.ByteStream) -> None:
        await stream.send(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode())
        for _ in range(size):
            await stream.send(b" ")
            await anyio.sleep(pause)

    return respond


def unused_address() -> str:
    """``127.0.0.1:port`` with nothing listening: connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@contextmanager
def blocking_fake_api(handle: Callable[[HttpRequest], tuple[int, bytes]]) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 in a thread, for blocking clients: ``handle`` answers
    each request with (status, body). Yields its ``host:port``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            path, _, query = self.path.partition("?")
            headers = {k.lower(): v for k, v in self.headers.items()}
            query_args = dict(urllib.parse.parse_qsl(query))
            status, out = handle(HttpRequest(self.command, path, query_args, headers, body))
            self.send_response(status)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        do_GET = do_POST = answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def raw(answer: bytes) -> Route:
    """A route that sends ``answer`` as it is (a malformed one, say) and hangs up."""

    async def respond(request: HttpRequest, stream: anyio.abc.ByteStream) -> None:
        await stream.send(answer)

    return respond


class Flood:
    """A route that sends a 200 answer with a body of ``size`` bytes in 64 KiB pieces,
    framed by ``framing`` ("length", "chunked" or "close"), or without end when ``size`` is
    None; ``sent`` counts the body bytes that left."""

    def __init__(self, size: int | None, framing: str = "length") -> None:
        self.size = size
        self.framing = framing
        self.sent = 0

    async def __call__(self, request: HttpRequest, stream: anyio.abc.ByteStream) -> None:
        head = "HTTP/1.1 200 OK\r\n"
        if self.framing == "length":
            head += f"Content-Length: {self.size}\r\n"
        elif self.framing == "chunked":
            head += "Transfer-Encoding: chunked\r\n"
        await stream.send(f"{head}\r\n".encode())
        piece = b"[" * 65536
        while self.size is None or self.sent < self.size:
            if self.framing == "chunked":
                await stream.send(b"%x\r\n%s\r\n" % (len(piece), piece))
            else:
                await stream.send(piece)
            self.sent += len(piece)


@contextmanager
def serve_auth(secret: str, topics: str = ".*", identity: str = "tester") -> Iterator[str]:
    """A local nsqd auth server (``--auth-http-address``): ``secret`` may publish and subscribe
    on the topics matching ``topics``; any other secret gets 403. Yields its address."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
            if query.get("secret") != [secret]:
                self.send_response(403)
                self.end_headers()
                self.wfile.write(b'{"message":"bad secret"}')
                return
            body = {
                "ttl": 3600,
                "identity": identity,
                "identity_url": "",
                "authorizations": [
                    {"topic": topics, "channels": [".*"], "permissions": ["subscribe", "publish"]}
                ],
            }
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
