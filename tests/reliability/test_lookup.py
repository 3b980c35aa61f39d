"""One bad lookupd must not stop the work: a slow, endless, malformed or garbage answer fails
that lookupd only, and the healthy one (a real nsqlookupd) is used."""

from __future__ import annotations

import time

import anyio
import anyio.abc
import pytest

from smartnsq import Consumer, Message, Producer
from smartnsq.errors import LookupFailed
from smartnsq.lookup.manager import LookupManager
from tests.helpers import (
    create_channel,
    drain,
    fake_http,
    http_response,
    listed_producers,
    unique,
    wait_until,
)

pytestmark = [pytest.mark.reliability, pytest.mark.integration, pytest.mark.anyio]

NOT_FOUND = http_response(404, b'{"message":"NOT_FOUND"}')


async def _topic_on_lookupd(cluster: object, topic: str) -> str:
    """Create ``topic`` (with channel ``ch``) and wait until the real lookupd lists it."""
    nsqd = cluster.nsqd[0]  # type: ignore[attr-defined]
    real: str = cluster.lookupd[0].http  # type: ignore[attr-defined]
    create_channel(nsqd.http, topic, "ch")
    await wait_until(lambda: listed_producers(real, topic), 10, "the lookupd to list the topic")
    return real


async def drip(path: str, stream: anyio.abc.ByteStream) -> None:
    """Headers at once, then one byte of JSON whitespace every half second (bounded)."""
    await stream.send(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    for _ in range(120):
        await stream.send(b"1\r\n \r\n")
        await anyio.sleep(0.5)


async def test_drip_feeding_lookupd_does_not_block_publish(classic_cluster, anyio_backend):
    topic = unique("drip_pub")
    real = await _topic_on_lookupd(classic_cluster, topic)
    async with fake_http(drip) as slow, Producer(lookupd_http_addresses=[slow, real]) as producer:
        with anyio.fail_after(4):  # under the lookup timeout (5 s): the slow one is not awaited
            await producer.publish(topic, b"through the healthy lookupd")
    got = await drain(classic_cluster.nsqd[0].tcp, topic, "ch", 1)
    assert [m.body for m in got] == [b"through the healthy lookupd"]


async def test_drip_feeding_lookupd_does_not_block_consume(classic_cluster, anyio_backend):
    topic = unique("drip_sub")
    real = await _topic_on_lookupd(classic_cluster, topic)
    async with Producer([classic_cluster.nsqd[0].tcp]) as producer:
        await producer.publish(topic, b"found")
    got: list[bytes] = []
    arrived = anyio.Event()

    async def handle(message: Message) -> None:
        got.append(message.body)
        arrived.set()

    async with (
        fake_http(drip) as slow,
        Consumer(topic, "ch", handle, lookupd_http_addresses=[slow, real]),
    ):
        with anyio.fail_after(4):
            await arrived.wait()
    assert got == [b"found"]


async def test_lookup_deadline_covers_the_whole_request(classic_cluster, anyio_backend):
    """Alone, the drip-feeding lookupd fails within the manager's timeout, not never."""
    async with fake_http(drip) as slow, LookupManager([slow], timeout=1.0) as lm:
        start = time.monotonic()
        with anyio.fail_after(5), pytest.raises(LookupFailed, match=r"within 1\.0s"):
            await lm.lookup("t")
        assert time.monotonic() - start < 3  # discovery and lookup: one deadline each


async def test_endless_body_is_capped(classic_cluster, anyio_backend):
    topic = unique("endless")
    real = await _topic_on_lookupd(classic_cluster, topic)
    sent = 0
    chunk = b"[" * 65536

    async def endless(path: str, stream: anyio.abc.ByteStream) -> None:
        nonlocal sent
        await stream.send(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        while sent < 64 << 20:  # bounded, far above the cap
            await stream.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
        await anyio.sleep_forever()

    async with fake_http(endless) as big:
        async with LookupManager([big], timeout=5.0, max_response_size=1 << 20) as lm:
            with anyio.fail_after(6), pytest.raises(LookupFailed, match="more than 1048576 bytes"):
                await lm.lookup(topic)
        # Reading stopped at the cap: what was sent is the cap plus socket buffers.
        assert sent < 32 << 20, sent
        async with LookupManager([big, real], timeout=5.0, max_response_size=1 << 20) as lm:
            with anyio.fail_after(6):
                layout = await lm.lookup(topic)
            assert [n.tcp_address for n in layout.producers] == [classic_cluster.nsqd[0].tcp]
            assert lm._health[f"http://{big}"].failures >= 1


async def test_malformed_entries_are_skipped_not_the_answer(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    host, port = nsqd.tcp.rsplit(":", 1)
    topic = unique("malformed")
    create_channel(nsqd.http, topic, "ch")
    entries = [  # raw JSON: Infinity is what Go-unlike servers may send, json reads it as inf
        f'{{"broadcast_address": "{host}", "tcp_port": 0, "http_port": 1}}',
        '{"broadcast_address": "10.9.9.9", "tcp_port": Infinity}',
        '{"broadcast_address": "", "hostname": null, "tcp_port": 4150}',
        '{"broadcast_address": "10.9.9.8", "tcp_port": "abc"}',
        f'{{"broadcast_address": "{host}", "tcp_port": {port}, "http_port": 1}}',
    ]
    body = f'{{"channels": ["ch"], "producers": [{", ".join(entries)}]}}'.encode()

    async def lookupd(path: str, stream: anyio.abc.ByteStream) -> None:
        await stream.send(http_response(200, body) if path.startswith("/lookup?") else NOT_FOUND)

    async with fake_http(lookupd) as fake:
        async with LookupManager([fake]) as lm:
            layout = await lm.lookup(topic, "w")
        assert [n.tcp_address for n in layout.producers] == [nsqd.tcp]
        async with Producer(lookupd_http_addresses=[fake]) as producer:
            with anyio.fail_after(4):
                await producer.publish(topic, b"to the good entry")
    got = await drain(nsqd.tcp, topic, "ch", 1)
    assert [m.body for m in got] == [b"to the good entry"]


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 200_000,  # the JSON decoder raises RecursionError
        b'{"producers": [' + b"[" * 200_000 + b"]}",
        b"\xff\xfe not even text",
        b"[]",
        b'{"producers": {"not": "a list"}}',
    ],
    ids=["deep-array", "deep-entry", "binary", "not-an-object", "bad-container"],
)
async def test_garbage_answer_fails_that_lookupd_only(classic_cluster, anyio_backend, body):
    topic = unique("garbage")
    real = await _topic_on_lookupd(classic_cluster, topic)

    async def garbage(path: str, stream: anyio.abc.ByteStream) -> None:
        await stream.send(http_response(200, body) if path.startswith("/lookup?") else NOT_FOUND)

    async with fake_http(garbage) as bad, LookupManager([bad, real]) as lm:
        with anyio.fail_after(4):
            layout = await lm.lookup(topic)
        assert [n.tcp_address for n in layout.producers] == [classic_cluster.nsqd[0].tcp]
        assert lm._health[f"http://{bad}"].failures == 1
        # Alone, it is a LookupFailed for the caller, never the parser's own exception.
        async with LookupManager([bad]) as alone:
            with pytest.raises(LookupFailed, match="unusable"):
                await alone.lookup(topic)
