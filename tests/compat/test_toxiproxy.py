"""The Toxiproxy helper of compat/ does what each fault says (a real toxiproxy-server)."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import pytest

from compat.toxiproxy import Proxy, Toxiproxy

pytestmark = pytest.mark.integration


@pytest.fixture
def echo() -> Iterator[str]:
    """A loopback TCP server that echoes every connection (one thread per connection)."""
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # a reset is what some cases are about
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        done.set()
        server.close()


def connect(proxy: Proxy, timeout: float = 2.0) -> socket.socket:
    host, port = proxy.address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout)


def roundtrip(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def test_faults_and_heal(toxiproxy: Toxiproxy, echo: str) -> None:
    proxy = toxiproxy.proxy("echo", echo)

    with connect(proxy) as s:
        assert roundtrip(s, b"hello") == b"hello"

    proxy.latency(200, 0, streams=("downstream",))
    with connect(proxy) as s:
        started = time.monotonic()
        assert roundtrip(s, b"slow") == b"slow"
        assert time.monotonic() - started >= 0.19
    proxy.heal()

    proxy.silence()
    with connect(proxy, timeout=0.5) as s:  # accepted; then nothing either way, no FIN
        s.sendall(b"lost")
        with pytest.raises(TimeoutError):
            s.recv(10)
    proxy.heal()

    proxy.reset_peer()
    with connect(proxy) as s:
        s.sendall(b"x")
        with pytest.raises(ConnectionResetError):
            s.recv(10)
    proxy.heal()

    with connect(proxy) as held:
        proxy.refuse()
        with pytest.raises(ConnectionRefusedError):
            connect(proxy)
        assert held.recv(10) == b""  # open connections are closed
    proxy.heal()
    assert proxy.toxics() == []

    proxy.slicer(4, 3, delay_us=20_000)  # 1-7 byte pieces, 20 ms apart
    with connect(proxy) as s:
        s.sendall(b"z" * 40)
        sizes = []
        while sum(sizes) < 40:
            sizes.append(len(s.recv(65536)))
        assert len(sizes) >= 4, sizes  # (a late reader may get two pieces at once)
    toxiproxy.heal()
    with connect(proxy) as s:
        assert roundtrip(s, b"healed") == b"healed"
