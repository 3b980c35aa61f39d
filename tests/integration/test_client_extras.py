"""More contract items against real servers: auto-touch, handler concurrency, discovery with
broken lookupds, the producer's connection pool and per-call timeout."""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from itertools import pairwise

import anyio
import pytest

from smartnsq import Consumer, Message, Producer
from smartnsq.errors import NSQTimeout
from smartnsq.protocol import FRAME_RESPONSE, encode_frame
from tests.helpers import channel_stats, create_channel, http_json, unique, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
]


async def test_auto_touch_keeps_a_long_handler_alive(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("touch")
    create_channel(nsqd.http, topic, "ch")
    async with Producer([nsqd.tcp]) as producer:
        await producer.publish(topic, b"slow")
    attempts: list[int] = []

    async def handle(message: Message) -> None:
        attempts.append(message.attempts)
        await anyio.sleep(4.5)  # > msg_timeout of 2 s: only TOUCHes keep it ours

    async with Consumer(
        topic, "ch", handle, nsqd_tcp_addresses=[nsqd.tcp], msg_timeout=2, auto_touch=True
    ) as consumer:
        await wait_until(lambda: consumer.stats().finished == 1, 15)
    stats = channel_stats(nsqd.http, topic, "ch")
    assert stats is not None
    assert attempts == [1]
    assert stats["timeout_count"] == 0 and stats["requeue_count"] == 0


async def test_without_auto_touch_the_server_times_the_message_out(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("notouch")
    create_channel(nsqd.http, topic, "ch")
    async with Producer([nsqd.tcp]) as producer:
        await producer.publish(topic, b"slow")
    attempts: list[int] = []

    async def handle(message: Message) -> None:
        attempts.append(message.attempts)
        if message.attempts == 1:
            await anyio.sleep(3.5)

    async with Consumer(
        topic, "ch", handle, nsqd_tcp_addresses=[nsqd.tcp], msg_timeout=2, max_in_flight=2
    ):
        await wait_until(lambda: 2 in attempts, 15)
    stats = channel_stats(nsqd.http, topic, "ch")
    assert stats is not None and stats["timeout_count"] >= 1  # the control for the test above


async def test_handler_concurrency_is_bounded(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("conc")
    async with Producer([nsqd.tcp]) as producer:
        await producer.publish_many(topic, [b"%d" % i for i in range(60)])
    running = peak = done = 0

    async def handle(message: Message) -> None:
        nonlocal running, peak, done
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.01)
        running -= 1
        done += 1

    async with Consumer(
        topic, "ch", handle, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=50, concurrency=3
    ):
        await wait_until(lambda: done >= 60, 20)
    assert peak == 3


class _Garbage(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"<html>not a lookupd</html>")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def garbage_lookupd() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Garbage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


async def test_broken_lookupds_do_not_stop_discovery(
    classic_cluster, garbage_lookupd, anyio_backend, caplog
):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("disc")
    async with Producer([nsqd.tcp]) as producer:
        await producer.publish_many(topic, [b"a", b"b", b"c"])
    caplog.set_level(logging.WARNING, logger="smartnsq")
    got: list[bytes] = []
    good = classic_cluster.lookupd[0].http
    async with Consumer(
        topic,
        "ch",
        lambda m: got.append(m.body),
        lookupd_http_addresses=["127.0.0.1:1", garbage_lookupd, good],
        lookupd_poll_interval=0.2,
        lookupd_poll_jitter=0.1,
    ):
        await wait_until(lambda: len(got) == 3, 20)
        await anyio.sleep(1.0)  # several more polls: the broken lookupds must not be re-logged
    warnings = [r.getMessage() for r in caplog.records if "lookupd" in r.getMessage()]
    assert sum("127.0.0.1:1" in w for w in warnings) == 1
    assert sum(garbage_lookupd in w for w in warnings) == 1


async def test_lookupd_polls_are_jittered(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("jitter")
    create_channel(nsqd.http, topic, "ch")
    real = classic_cluster.lookupd[0].http
    polls: list[float] = []

    class Counting(BaseHTTPRequestHandler):  # forwards to the real lookupd, notes each lookup
        def do_GET(self) -> None:
            if self.path.startswith("/lookup"):
                polls.append(time.monotonic())
            try:
                with urllib.request.urlopen(f"http://{real}{self.path}", timeout=5) as resp:
                    body, status = resp.read(), resp.status
            except urllib.error.HTTPError as exc:  # e.g. 404 for /listlookup on classic
                body, status = exc.read(), exc.code
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Counting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        async with Consumer(
            topic,
            "ch",
            lambda m: None,
            lookupd_http_addresses=[f"127.0.0.1:{server.server_address[1]}"],
            lookupd_poll_interval=2.0,  # polls are at least 1 s apart whatever this says
            lookupd_poll_jitter=0.5,
        ):
            await wait_until(lambda: len(polls) >= 5, 30, "5 lookups")
    finally:
        server.shutdown()
    gaps = [b - a for a, b in pairwise(polls[:5])]
    assert all(0.95 < g < 3.5 for g in gaps), gaps  # 2 s x uniform(0.5, 1.5)
    assert max(gaps) - min(gaps) > 0.02, gaps  # without jitter they would all be ~2 s


async def test_producer_connection_pool(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("pool")
    async with Producer([nsqd.tcp], connections_per_nsqd=3) as producer:

        async def worker() -> None:
            for _ in range(50):
                await producer.publish(topic, b"x")

        async with anyio.create_task_group() as tg:
            for _ in range(32):
                tg.start_soon(worker)
        stats = http_json(f"http://{nsqd.http}/stats?format=json")
        clients = [p for p in stats.get("producers") or [] if "pub_counts" in p]
        mine = [p for p in clients if any(c["topic"] == topic for c in p["pub_counts"] or [])]
        assert len(mine) == 3
    topic_stats = next(t for t in stats["topics"] if t["topic_name"] == topic)
    assert topic_stats["message_count"] == 32 * 50


async def test_per_call_timeout_against_a_silent_server(anyio_backend):
    """A server that completes the handshake and then never answers: publish raises
    NSQTimeout after the call's timeout instead of hanging."""

    async def silent(stream) -> None:
        async with stream:
            await stream.receive()  # magic + IDENTIFY
            await stream.send(
                encode_frame(FRAME_RESPONSE, json.dumps({"max_rdy_count": 2500}).encode())
            )
            while await stream.receive():
                pass

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, silent)
        async with Producer([f"127.0.0.1:{port}"], max_retries=0) as producer:
            with anyio.fail_after(5):
                with pytest.raises(NSQTimeout, match="may or may not"):
                    await producer.publish("t", b"x", timeout=0.3)
        tg.cancel_scope.cancel()
