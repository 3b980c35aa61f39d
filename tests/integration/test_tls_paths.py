"""Every TLS path against a real nsqd that requires TLS: the async consumer and producer on
asyncio, trio and uvloop, the blocking producer and consumer, and a detached blocking
connection, each plain and compressed, with messages that span many TLS records.

asyncio and uvloop use our own TLS codec (``smartnsq.protocol.tls``), trio anyio's TLSStream;
the blocking connection runs the codec over a non-blocking socket.
"""

from __future__ import annotations

import json
import logging
import random
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.abc
import pytest
import trustme
from anyio.from_thread import start_blocking_portal

from smartnsq import Connection, ConnectionConfig, Consumer, Producer, sync
from smartnsq.errors import ConnectionClosed, NSQTimeout
from smartnsq.net.blocking import SyncConnection
from smartnsq.protocol import RawMessage, commands, decode_message
from smartnsq.protocol.frames import FRAME_MESSAGE, FRAME_RESPONSE, HEARTBEAT, encode_frame
from smartnsq.protocol.message import MessageLayout
from tests.fakes import fake_server, read_identify, read_until_closed
from tests.helpers import (
    EVERY_LOOP,
    channel_stats,
    create_channel,
    drain,
    http_json,
    settled,
    start_tls_cluster,
    topic_stats,
    unique,
    wait_for,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

COMPRESSION = pytest.mark.parametrize(
    "compression",
    [{}, {"snappy": True}, {"deflate": True}],
    ids=["plain", "snappy", "deflate"],
)


@pytest.fixture(scope="module")
def tls_ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory, tls_ca: trustme.CA) -> Iterator[Any]:
    cluster = start_tls_cluster(tls_ca, tmp_path_factory.mktemp("tls_paths"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def tls(tls_ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    tls_ca.configure_trust(ctx)
    return ctx


def mixed_bodies(count: int, seed: int = 0) -> list[bytes]:
    """Distinct bodies of mixed sizes: a few bytes, around one TLS record (16 KiB), a few
    records, and every 50th one 100 KiB (a frame of seven records); odd ones random (they
    stay big compressed), even ones repetitive."""
    rnd = random.Random(seed)
    sizes = [10, 200, 1000, 3, 16_390, 50, 500, 16_379, 20, 40_000]
    out = []
    for i in range(count):
        size = 100 * 1024 if i % 50 == 7 else sizes[i % len(sizes)]
        fill = rnd.randbytes(size) if i % 2 else bytes([i % 251]) * size
        out.append(b"%04d:" % i + fill)
    return out


def wait_settled(http: str, topic: str, channel: str, count: int) -> None:
    try:
        wait_for(lambda: settled(http, topic, channel, count), 10, f"{count} messages FINed")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; channel: {channel_summary(http, topic, channel)}") from None


def channel_summary(http: str, topic: str, channel: str) -> dict[str, Any]:
    s = channel_stats(http, topic, channel) or {}
    keys = ("message_count", "depth", "in_flight_count", "requeue_count", "timeout_count")
    return {k: s.get(k) for k in keys}


def message_count(http: str, topic: str) -> int | None:
    t = topic_stats(http, topic)
    return None if t is None else int(t["message_count"])


# -- async ----------------------------------------------------------------------------------------


@EVERY_LOOP
@COMPRESSION
async def test_consumer_over_tls(tls_cluster, tls, anyio_backend, compression):
    nsqd = tls_cluster.nsqd[0]
    topic, ch = unique("tls_consume"), "c"
    create_channel(nsqd.http, topic, ch)
    bodies = mixed_bodies(300)
    async with Producer([nsqd.tcp], tls=tls, **compression) as producer:
        await producer.publish_many(topic, bodies)
    assert message_count(nsqd.http, topic) == 300

    got: list[bytes] = []

    async def handle(message: Any) -> None:
        got.append(message.body)

    async with Consumer(
        topic, ch, handle, nsqd_tcp_addresses=[nsqd.tcp], tls=tls, max_in_flight=50, **compression
    ) as consumer:
        await wait_until(
            lambda: settled(nsqd.http, topic, ch, 300) and consumer.stats().finished == 300,
            30,
            "all 300 messages handled and FINed",
            describe=lambda: (len(got), channel_summary(nsqd.http, topic, ch)),
        )
    assert sorted(got) == sorted(bodies)
    summary = channel_summary(nsqd.http, topic, ch)
    assert summary["requeue_count"] == 0 and summary["timeout_count"] == 0, summary


@EVERY_LOOP
@COMPRESSION
async def test_producer_over_tls(tls_cluster, tls, anyio_backend, compression):
    nsqd = tls_cluster.nsqd[0]
    topic, ch = unique("tls_publish"), "c"
    create_channel(nsqd.http, topic, ch)
    rnd = random.Random(1)
    batch = [rnd.randbytes(rnd.randrange(16_385, 70_000)) for _ in range(40)]
    singles = [rnd.randbytes(17_000 + i) for i in range(5)]
    async with Producer([nsqd.tcp], tls=tls, **compression) as producer:
        await producer.publish_many(topic, batch)
        for body in singles:
            await producer.publish(topic, body)
    assert message_count(nsqd.http, topic) == 45
    got = await drain(nsqd.tcp, topic, ch, 45, config=ConnectionConfig(tls=tls, **compression))
    assert sorted(m.body for m in got) == sorted(batch + singles)


@EVERY_LOOP
async def test_connection_closed_by_nsqd_ends_cleanly(tls_cluster, tls, anyio_backend):
    """nsqd closes a subscriber's connection (with a close_notify) when its channel is
    deleted: run() ends, and the reason is nsqd closing it, not a broken TLS stream."""
    nsqd = tls_cluster.nsqd[0]
    topic, ch = unique("tls_closed"), "c"
    create_channel(nsqd.http, topic, ch)
    conn = await Connection.open(nsqd.tcp, ConnectionConfig(tls=tls))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(conn.run)
            await conn.request(commands.sub(topic, ch))
            http_json(f"http://{nsqd.http}/channel/delete?topic={topic}&channel={ch}", "POST")
    assert conn.closed
    reason = conn.close_reason
    # A TLS stream that broke would end it with an SSLError or "connection ... broke".
    assert not isinstance(reason, ssl.SSLError | anyio.BrokenResourceError), repr(reason)
    assert "broke" not in str(reason) and reason.__cause__ is None, repr(reason)
    # The same reason as a plain connection that nsqd closes, on every loop.
    assert isinstance(reason, ConnectionClosed), repr(reason)
    assert str(reason) == f"nsqd {nsqd.tcp} closed the connection"


@EVERY_LOOP
async def test_consumer_recovers_when_nsqd_closes_its_tls_connection(
    tls_cluster, tls, anyio_backend, caplog
):
    nsqd = tls_cluster.nsqd[0]
    topic, ch = unique("tls_recover"), "c"
    create_channel(nsqd.http, topic, ch)
    got: list[bytes] = []

    async def handle(message: Any) -> None:
        got.append(message.body)

    caplog.set_level(logging.DEBUG, logger="smartnsq")
    async with (
        Producer([nsqd.tcp], tls=tls) as producer,
        Consumer(
            topic, ch, handle, nsqd_tcp_addresses=[nsqd.tcp], tls=tls, reconnect_min=0.1
        ) as consumer,
    ):
        await wait_until(lambda: consumer.stats().connections == 1, 10, "subscribed")
        await producer.publish(topic, b"before")
        await wait_until(lambda: got == [b"before"], 10, "the first message")
        first = (channel_stats(nsqd.http, topic, ch) or {})["clients"][0]["remote_address"]
        http_json(f"http://{nsqd.http}/channel/delete?topic={topic}&channel={ch}", "POST")

        def resubscribed() -> bool:
            clients = (channel_stats(nsqd.http, topic, ch) or {}).get("clients") or []
            return any(c["remote_address"] != first for c in clients)

        await wait_until(resubscribed, 15, "a new subscription after nsqd closed the first")
        await producer.publish(topic, b"after")
        await wait_until(lambda: got == [b"before", b"after"], 10, "the message after")
    tls_trouble = [r.getMessage() for r in caplog.records if "SSL" in r.getMessage()]
    assert not tls_trouble


# -- a TLS server that ends the session but not the TCP connection ------------------------------


def closing_tls_server(context: ssl.SSLContext, tail: bytes) -> Any:
    """A fake nsqd: IDENTIFY with TLS, the handshake, OK; then it answers the first command
    with OK, its close_notify and ``tail`` in one write, and leaves the socket open (nsqd
    closes it too, which would hide a close_notify the client missed)."""

    async def serve(stream: anyio.abc.SocketStream) -> None:
        await read_identify(stream)
        reply = json.dumps({"max_rdy_count": 2500, "tls_v1": True}).encode()
        await stream.send(encode_frame(FRAME_RESPONSE, reply))
        incoming, out = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = context.wrap_bio(incoming, out, server_side=True)
        while True:
            try:
                obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                if out.pending:
                    await stream.send(out.read())
                incoming.write(await stream.receive())
        # TLS 1.2: the Finished is still in ``out``; the OK goes out in the same write.
        obj.write(encode_frame(FRAME_RESPONSE, b"OK"))
        await stream.send(out.read())
        command = b""
        while not command.endswith(b"\n"):
            try:
                command += obj.read(1024)
            except ssl.SSLWantReadError:
                incoming.write(await stream.receive())
        obj.write(encode_frame(FRAME_RESPONSE, b"OK"))
        try:
            obj.unwrap()
        except ssl.SSLWantReadError:  # it would wait for the client's close_notify
            pass
        await stream.send(out.read() + tail)
        await read_until_closed(stream)

    return serve


@pytest.fixture(scope="module")
def server_tls(tls_ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls_ca.issue_cert("127.0.0.1").configure_cert(ctx)
    return ctx


@pytest.fixture(scope="module")
def server_tls12(tls_ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls_ca.issue_cert("127.0.0.1").configure_cert(ctx)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    return ctx


@EVERY_LOOP
async def test_ok_in_the_flight_that_ends_the_handshake(server_tls12, tls, anyio_backend):
    """TLS 1.2 ends with the server's Finished; this server writes its OK right behind it,
    in the same write. The client must find that OK among the handshake's bytes."""
    async with fake_server(closing_tls_server(server_tls12, b"")) as address:
        with anyio.fail_after(5):
            conn = await Connection.open(address, ConnectionConfig(tls=tls))
            async with anyio.create_task_group() as tg:
                tg.start_soon(conn.run)
                assert await conn.request(commands.sub("t", "c")) == b"OK"
                await conn.close()


@pytest.mark.timeout(30)  # a client spinning on the bytes behind the alert never yields
@EVERY_LOOP
@pytest.mark.parametrize(
    "tail", [b"", b"\x17\x03\x03\x00\x05trail"], ids=["close_notify", "bytes_after_it"]
)
async def test_close_notify_without_eof_ends_the_connection(server_tls, tls, anyio_backend, tail):
    """The session's end is the close_notify, not the socket's: a connection whose server
    sent one ends although the socket stays open, and bytes behind it change nothing."""
    async with fake_server(closing_tls_server(server_tls, tail)) as address:
        conn = await Connection.open(address, ConnectionConfig(tls=tls))
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(conn.run)
                assert await conn.request(commands.sub("t", "c")) == b"OK"
        reason = conn.close_reason
        assert not isinstance(reason, ssl.SSLError | anyio.BrokenResourceError), repr(reason)
        assert "broke" not in str(reason) and reason.__cause__ is None, repr(reason)


# -- blocking -------------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", [{}, {"snappy": True}], ids=["plain", "snappy"])
def test_sync_publish_and_consume_over_tls(tls_cluster, tls, compression):
    nsqd = tls_cluster.nsqd[0]
    topic, ch = unique("tls_sync"), "c"
    create_channel(nsqd.http, topic, ch)
    bodies = mixed_bodies(300, seed=2)
    with sync.Producer([nsqd.tcp], tls=tls, **compression) as producer:
        producer.publish_many(topic, bodies[:200])
        for body in bodies[200:]:
            producer.publish(topic, body)
    assert message_count(nsqd.http, topic) == 300

    got: list[bytes] = []
    with sync.Consumer(
        topic, ch, nsqd_tcp_addresses=[nsqd.tcp], tls=tls, max_in_flight=50, **compression
    ) as consumer:
        for message in consumer:
            got.append(message.body)
            if len(got) == 300:
                break
    assert sorted(got) == sorted(bodies)
    wait_settled(nsqd.http, topic, ch, 300)
    assert channel_summary(nsqd.http, topic, ch)["requeue_count"] == 0


def test_sync_single_publishes_over_tls(tls_cluster, tls):
    """One publish at a time, each waiting for its answer: the busy-poll path."""
    nsqd = tls_cluster.nsqd[0]
    topic = unique("tls_single")
    with sync.Producer([nsqd.tcp], tls=tls, busy_poll=0.001) as producer:
        for i in range(200):
            producer.publish(topic, b"single %d" % i)
    assert message_count(nsqd.http, topic) == 200


def test_sync_threads_share_a_tls_connection(tls_cluster, tls):
    """Four threads publish through one producer: requests pipelined on a TLS connection,
    whichever thread holds the read lock reading for all."""
    nsqd = tls_cluster.nsqd[0]
    topic = unique("tls_threads")
    errors: list[BaseException] = []
    with sync.Producer([nsqd.tcp], tls=tls) as producer:

        def publish(n: int) -> None:
            try:
                for i in range(50):
                    producer.publish(topic, b"%d-%d" % (n, i) + b"x" * (i * 700))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=publish, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors
    assert message_count(nsqd.http, topic) == 200


@pytest.mark.timeout(30)  # a reader spinning on the bytes behind the alert never returns
@pytest.mark.parametrize(
    "tail", [b"", b"\x17\x03\x03\x00\x05trail"], ids=["close_notify", "bytes_after_it"]
)
def test_sync_close_notify_without_eof_closes_the_connection(server_tls, tls, tail):
    """The blocking connection: the server's OK and close_notify in one read, the socket left
    open. The request gets its OK; the connection is closed from then on, so the next request
    fails at once instead of waiting out its timeout."""
    serve = closing_tls_server(server_tls, tail)
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(fake_server(serve)) as address,
    ):
        conn = SyncConnection.open(address, ConnectionConfig(tls=tls), 5.0)
        try:
            assert conn.request(commands.sub("t", "c"), 5.0, publish=False) == b"OK"
            started = time.monotonic()
            with pytest.raises(ConnectionClosed) as caught:
                conn.request(commands.sub("t", "c"), 5.0, publish=False)
            assert time.monotonic() - started < 2.0
            assert not isinstance(caught.value, NSQTimeout), repr(caught.value)
        finally:
            conn.close(1.0)


@COMPRESSION
def test_detached_tls_connection_reads_a_message(tls_cluster, tls, compression):
    """A Spark task's path: a handshaken blocking connection handed over, then SUB, RDY and
    FIN through its ``compress`` and the socket, frames through its ``decompress`` and
    decoder."""
    nsqd = tls_cluster.nsqd[0]
    topic, ch = unique("tls_detach"), "c"
    create_channel(nsqd.http, topic, ch)
    body = random.Random(3).randbytes(50_000)  # several records
    with sync.Producer([nsqd.tcp], tls=tls) as producer:
        producer.publish(topic, body)

    config = ConnectionConfig(tls=tls, **compression)
    detached = SyncConnection.open(nsqd.tcp, config, 5.0).detach(5.0)
    sock = detached.sock
    compress = detached.compress or (lambda b: b)
    decompress = detached.decompress or (lambda b: b)
    layout = MessageLayout(binary_id=detached.features.youzan)
    try:
        sock.sendall(compress(commands.sub(topic, ch) + commands.rdy(1)))
        got: RawMessage | None = None
        answers: list[bytes] = []
        while got is None:
            data = sock.recv(65536)
            assert data, "nsqd closed the connection"
            for ftype, payload in detached.decoder.feed(decompress(data)):
                if ftype == FRAME_MESSAGE:
                    got = decode_message(payload, layout, RawMessage)
                elif ftype == FRAME_RESPONSE and payload == HEARTBEAT:
                    sock.sendall(compress(commands.NOP))
                else:
                    answers.append(payload)
        assert answers == [b"OK"]  # the SUB's
        assert got.body == body
        sock.sendall(compress(commands.fin(got.id)))
        wait_settled(nsqd.http, topic, ch, 1)
    finally:
        sock.close()
