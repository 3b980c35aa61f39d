"""One bad nsqd must not stop a producer: it is marked down and routed around."""

from __future__ import annotations

import os
import signal
import time

import anyio
import pytest

from smartnsq import Connection, ConnectionConfig, Producer
from smartnsq.errors import NSQError, NSQTimeout, ProtocolError
from tests.fakes import fake_server, garbage, heartbeats_only, identify_reply
from tests.helpers import EVERY_LOOP, topic_stats, unique, wait_for

pytestmark = [pytest.mark.reliability, pytest.mark.anyio]

MALFORMED_IDENTIFY = [
    b"[]",  # AttributeError before
    b'"text"',
    b'{"max_rdy_count": Infinity}',  # OverflowError before
    b'{"max_rdy_count": "many"}',  # ValueError before
    b'{"msg_timeout": -5}',
    b'{"max_rdy_count": 1e300}',
    b"[" * 100_000 + b"]" * 100_000,  # RecursionError before
    b"{not json",
]


@pytest.mark.parametrize("reply", MALFORMED_IDENTIFY, ids=lambda r: repr(r[:24]))
async def test_a_malformed_identify_reply_is_a_protocol_error(reply, anyio_backend):
    async with fake_server(identify_reply(reply)) as address:
        with pytest.raises(ProtocolError, match="IDENTIFY reply"):
            await Connection.open(address, ConnectionConfig())


async def test_a_silent_nsqd_is_given_up_after_two_heartbeat_intervals(anyio_backend):
    async with fake_server(identify_reply(b'{"max_rdy_count": 2500}')) as address:
        conn = await Connection.open(address, ConnectionConfig(heartbeat_interval=1))
        started = time.monotonic()
        with anyio.fail_after(10):
            await conn.run()
        took = time.monotonic() - started
    assert isinstance(conn.close_reason, NSQTimeout)
    assert 2.0 <= took < 3.5  # 2 x 1 s, plus a margin (it was 2 x 1 s + 5 s)


async def publish_all(producer: Producer, topic: str, count: int) -> tuple[int, int]:
    ok = failed = 0
    for i in range(count):
        try:
            await producer.publish(topic, b"m%d" % i)
            ok += 1
        except NSQError:
            failed += 1
    return ok, failed


@pytest.mark.integration
@pytest.mark.parametrize("bad", ["garbage", "http port", "bad identify"])
async def test_a_node_that_does_not_speak_nsq_is_routed_around(classic_cluster, anyio_backend, bad):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("garbage")
    serve = garbage if bad != "bad identify" else identify_reply(b"[]")
    async with fake_server(serve) as fake:
        address = nsqd.http if bad == "http port" else fake
        async with Producer([address, nsqd.tcp], timeout=2, max_retries=1) as producer:
            with anyio.fail_after(20):
                ok, failed = await publish_all(producer, topic, 60)
    assert (ok, failed) == (60, 0)
    stats = wait_for(lambda: topic_stats(nsqd.http, topic), what="topic stats")
    assert stats["message_count"] == 60


@pytest.mark.integration
async def test_a_node_that_never_answers_is_avoided_after_one_timeout(
    classic_cluster, anyio_backend
):
    """Before, every other publish went to the mute node and timed out."""
    nsqd = classic_cluster.nsqd[0]
    topic = unique("mute")
    async with (
        fake_server(heartbeats_only) as fake,
        Producer([fake, nsqd.tcp], timeout=0.5, max_retries=1) as producer,
    ):
        with anyio.fail_after(20):
            ok, failed = await publish_all(producer, topic, 60)
    # The first publish to reach the mute node times out; after that it is avoided (probed
    # with one publish at a time once its back-off ends).
    assert failed <= 3, (ok, failed)
    assert ok + failed == 60


@pytest.mark.integration
@EVERY_LOOP
async def test_a_stopped_nsqd_does_not_stall_publishing_to_a_healthy_one(
    cluster_factory, anyio_backend
):
    cluster = cluster_factory("classic", nsqd=2)
    a, b = cluster.nsqd
    topic = unique("sigstop")
    async with Producer([a.tcp, b.tcp], timeout=1, max_retries=1) as producer:
        ok, failed = await publish_all(producer, topic, 10)  # both nodes in use
        assert (ok, failed) == (10, 0)
        os.kill(a.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with anyio.fail_after(30):
                ok, failed = await publish_all(producer, topic, 200)
            took = time.monotonic() - started
        finally:
            os.kill(a.pid, signal.SIGCONT)
    assert failed <= 3, (ok, failed)
    assert took < 8, f"200 publishes took {took:.1f}s with one of two nsqd stopped"
