"""TLSCodec (our own TLS: an ssl.SSLObject on memory BIOs) against a server SSLObject, no sockets.

Every test runs on TLS 1.2 and on 1.3 (the server's context pins the version): their
handshakes end differently (1.2: the server's Finished comes last; 1.3: the client's, and the
server sends session tickets after it), and that is where bytes go missing if any do.
"""

from __future__ import annotations

import random
import ssl
from functools import cache

import pytest
import trustme
from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.protocol.tls import TLSCodec
from tests.helpers import chunked

VERSIONS = pytest.mark.parametrize(
    "version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3], ids=["tls1.2", "tls1.3"]
)
HOST = "localhost"
RECORD_HEADER = 5
APPLICATION_DATA = 23


@cache
def ca() -> trustme.CA:
    return trustme.CA()


@cache
def server_context(version: ssl.TLSVersion) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca().issue_cert(HOST).configure_cert(ctx)
    ctx.minimum_version = ctx.maximum_version = version
    return ctx


@cache
def client_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca().configure_trust(ctx)
    return ctx


class Server:
    """The server end: an SSLObject on two memory BIOs, driven by hand."""

    def __init__(self, version: ssl.TLSVersion) -> None:
        self.incoming = ssl.MemoryBIO()
        self.out = ssl.MemoryBIO()
        self.obj = server_context(version).wrap_bio(self.incoming, self.out, server_side=True)
        self.handshaken = False

    def handshake(self, data: bytes) -> bytes:
        self.incoming.write(data)
        try:
            self.obj.do_handshake()
        except ssl.SSLWantReadError:
            pass
        else:
            self.handshaken = True
        return self.out.read()

    def send(self, data: bytes) -> bytes:
        """``data`` as records."""
        view = memoryview(data)
        while view:
            view = view[self.obj.write(view) :]
        return self.out.read()

    def receive(self, data: bytes) -> bytes:
        """The plaintext of ``data`` (every record complete)."""
        self.incoming.write(data)
        parts = []
        while True:
            try:
                parts.append(self.obj.read(65536))
            except ssl.SSLWantReadError:
                return b"".join(parts)

    def close(self) -> bytes:
        """Our close_notify."""
        try:
            self.obj.unwrap()
        except ssl.SSLWantReadError:  # it waits for the client's: not needed here
            pass
        return self.out.read()


def connect(version: ssl.TLSVersion, server_writes: bytes = b"") -> tuple[TLSCodec, Server, bytes]:
    """A handshaken client and server, bytes pumped both ways.

    ``server_writes`` is sent by the server as soon as its handshake is over, in the same
    flight as its last handshake bytes. Returns the bytes of the server's last flight that the
    client has not been given, if the client had finished before it (TLS 1.3), else b"".
    """
    client, server = TLSCodec(client_context(), HOST), Server(version)
    to_server = client.handshake()
    assert to_server and not client.handshaken  # the ClientHello
    for _ in range(5):
        to_client = server.handshake(to_server)
        if server.handshaken:
            to_client += server.send(server_writes) if server_writes else b""
            if client.handshaken:  # TLS 1.3: the client finished first
                return client, server, to_client
        to_server = client.handshake(to_client)
        if server.handshaken and client.handshaken:
            assert to_server == b""
            return client, server, b""
    raise AssertionError("the handshake did not finish in five round trips")


def handshaken(version: ssl.TLSVersion) -> tuple[TLSCodec, Server]:
    """A client and server past the handshake, the server's last bytes (TLS 1.3 session
    tickets) read by the client."""
    client, server, rest = connect(version)
    assert client.decrypt(rest) == b""
    assert not client.has_outgoing
    return client, server


def records(data: bytes) -> list[int]:
    """The content type of each TLS record in ``data`` (which must end on a record's end)."""
    types, at = [], 0
    while at < len(data):
        length = int.from_bytes(data[at + 3 : at + 5])
        types.append(data[at])
        at += RECORD_HEADER + length
    assert at == len(data)
    return types


def payload(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


# -- handshake ------------------------------------------------------------------------------------


@VERSIONS
def test_handshake_completes(version):
    client, server = handshaken(version)
    assert client.handshaken and server.handshaken
    assert server.obj.version() == {"TLSv1_2": "TLSv1.2", "TLSv1_3": "TLSv1.3"}[version.name]
    assert not client.closed


@VERSIONS
def test_handshake_fed_one_byte_at_a_time(version):
    client, server = TLSCodec(client_context(), HOST), Server(version)
    to_server = client.handshake()
    for _ in range(5):
        to_client = server.handshake(to_server)
        if client.handshaken:
            break
        to_server = b"".join(client.handshake(to_client[i : i + 1]) for i in range(len(to_client)))
    assert client.handshaken and server.handshaken
    assert server.receive(client.encrypt(b"after")) == b"after"


def test_data_with_the_last_handshake_flight_is_kept():
    """TLS 1.2: the server may write right behind its Finished, in the flight that ends the
    client's handshake; ``decrypt(b"")`` gives it. (TLS 1.3 ends the client's handshake on a
    flight the server sends before it can write data: Python's ssl has no 0.5-RTT data.)"""
    client, _, rest = connect(ssl.TLSVersion.TLSv1_2, server_writes=b"OK right away")
    assert rest == b""  # it all went to handshake()
    assert client.handshaken
    assert client.decrypt(b"") == b"OK right away"
    assert client.decrypt(b"") == b""


def test_data_behind_the_tls13_tickets_is_kept():
    """TLS 1.3: the server's session tickets and its first data come in one flight after the
    client finished; decrypt gives the data and no bytes to send back."""
    client, _, rest = connect(ssl.TLSVersion.TLSv1_3, server_writes=b"OK right away")
    assert records(rest).count(APPLICATION_DATA) >= 2  # tickets are encrypted records too
    assert client.decrypt(rest) == b"OK right away"
    assert not client.has_outgoing


# -- data -----------------------------------------------------------------------------------------


@VERSIONS
@pytest.mark.parametrize("size", [1, 16 * 1024, 16 * 1024 + 1, 200 * 1024])
def test_data_both_ways(version, size):
    client, server = handshaken(version)
    up, down = payload(size, 1), payload(size, 2)
    wire = client.encrypt(up)
    assert set(records(wire)) == {APPLICATION_DATA}
    assert len(records(wire)) >= -(-size // (16 * 1024))  # a record holds 16 KiB at most
    assert server.receive(wire) == up
    assert client.decrypt(server.send(down)) == down
    assert not client.has_outgoing and client.outgoing() == b""


@VERSIONS
def test_many_records_in_one_decrypt(version):
    client, server = handshaken(version)
    pieces = [payload(n, n) for n in (5, 70_000, 1, 16_384, 3)]
    wire = b"".join(server.send(p) for p in pieces)
    assert len(records(wire)) >= 9
    assert client.decrypt(wire) == b"".join(pieces)


@VERSIONS
def test_memoryview_in_and_out(version):
    client, server = handshaken(version)
    assert server.receive(client.encrypt(memoryview(b"xxview"))[:]) == b"xxview"
    assert client.decrypt(memoryview(server.send(b"back"))) == b"back"


@VERSIONS
@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=40_000), min_size=1, max_size=5),
    cuts=st.lists(st.integers(min_value=0), max_size=40),
)
def test_records_cut_anywhere_give_back_the_plaintext(version, sizes, cuts):
    client, server = handshaken(version)
    pieces = [payload(n, i) for i, n in enumerate(sizes)]
    wire = b"".join(server.send(p) for p in pieces)
    got = []
    for chunk in chunked(wire, cuts):
        got.append(client.decrypt(chunk))
    assert b"".join(got) == b"".join(pieces)
    assert not client.closed and not client.has_outgoing


@VERSIONS
def test_an_incomplete_record_gives_nothing_yet(version):
    client, server = handshaken(version)
    wire = server.send(b"one record")
    for i in range(len(wire) - 1):
        assert client.decrypt(wire[i : i + 1]) == b""
    assert client.decrypt(wire[-1:]) == b"one record"


# -- the end --------------------------------------------------------------------------------------


@VERSIONS
def test_server_close_notify_returns_what_came_before(version):
    client, server = handshaken(version)
    wire = server.send(b"last words") + server.close()
    assert client.decrypt(wire) == b"last words"
    assert client.closed
    assert client.decrypt(b"") == b""


@VERSIONS
@pytest.mark.parametrize("cut", [1, 5, -1])
def test_server_close_notify_cut(version, cut):
    client, server = handshaken(version)
    data = server.send(b"before")
    alert = server.close()
    # TLS 1.3 hides an alert's type inside an application-data record
    assert records(alert) == ([21] if version == ssl.TLSVersion.TLSv1_2 else [APPLICATION_DATA])
    wire = data + alert
    at = len(data) + cut if cut > 0 else len(wire) + cut
    assert client.decrypt(wire[:at]) == b"before"
    assert not client.closed
    assert client.decrypt(wire[at:]) == b""
    assert client.closed


@pytest.mark.timeout(10)  # the failure this guards against is an endless loop
@VERSIONS
def test_server_close_notify_with_bytes_behind_it(version):
    """Nothing valid follows a close_notify, but a broken or hostile server may send more in
    the same read: decrypt must still return (not spin on bytes OpenSSL no longer reads)."""
    client, server = handshaken(version)
    wire = server.send(b"before") + server.close() + b"\x17\x03\x03\x00\x05trail"
    assert client.decrypt(wire) == b"before"
    assert client.closed


@VERSIONS
def test_client_close_is_a_clean_close_for_the_server(version):
    client, server = handshaken(version)
    wire = client.encrypt(b"bye") + client.close()
    server.incoming.write(wire)
    assert server.obj.read(100) == b"bye"
    # The end of the stream: b"" (with nothing to read it raises SSLWantReadError), and the
    # server's own close completes at once because ours arrived.
    assert server.obj.read(100) == b""
    server.obj.unwrap()
    assert server.out.pending  # its close_notify


@VERSIONS
def test_client_close_after_the_server_closed(version):
    client, server = handshaken(version)
    client.decrypt(server.close())
    assert client.closed
    server.incoming.write(client.close())
    with pytest.raises(ssl.SSLZeroReturnError):  # both closed: a clean end for the server
        server.obj.read(100)


# -- errors ---------------------------------------------------------------------------------------


@VERSIONS
def test_garbage_raises(version):
    client, _ = handshaken(version)
    with pytest.raises(ssl.SSLError):
        client.decrypt(b"HTTP/1.1 400 Bad Request\r\n\r\n")


@VERSIONS
def test_a_tampered_record_raises(version):
    client, server = handshaken(version)
    wire = bytearray(server.send(b"x" * 100))
    wire[-1] ^= 1  # in the authentication tag
    with pytest.raises(ssl.SSLError):
        client.decrypt(bytes(wire))


@VERSIONS
def test_garbage_in_the_handshake_raises(version):
    client = TLSCodec(client_context(), HOST)
    client.handshake()
    with pytest.raises(ssl.SSLError):
        client.handshake(b"E_INVALID not a TLS server\n" * 4)


def pump_until_error(client: TLSCodec, server: Server) -> ssl.SSLError:
    to_server = client.handshake()
    for _ in range(5):
        to_client = server.handshake(to_server)
        try:
            to_server = client.handshake(to_client)
        except ssl.SSLError as exc:
            return exc
    raise AssertionError("the handshake did not fail")


@VERSIONS
def test_an_untrusted_certificate_fails_the_handshake(version):
    client = TLSCodec(ssl.create_default_context(), HOST)  # the system's CAs only
    exc = pump_until_error(client, Server(version))
    assert isinstance(exc, ssl.SSLCertVerificationError)
    assert "unable to get local issuer certificate" in exc.verify_message
    assert not client.handshaken


@VERSIONS
def test_a_wrong_host_name_fails_the_handshake(version):
    client = TLSCodec(client_context(), "nsqd.example.org")
    exc = pump_until_error(client, Server(version))
    assert isinstance(exc, ssl.SSLCertVerificationError)
    assert "nsqd.example.org" in exc.verify_message
    assert not client.handshaken
