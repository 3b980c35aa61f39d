"""Producer and consumer stats, and what they log over a node's outage, against real nsqd."""

from __future__ import annotations

import logging
import signal

import anyio
import pytest

from compat.cluster import free_port
from smartnsq import Consumer, Message, Producer, ProducerStats
from smartnsq.errors import NSQError
from smartnsq.sync import Producer as SyncProducer
from tests.helpers import channel_stats, create_channel, unique, wait_until

pytestmark = [pytest.mark.integration]


def dead_address() -> str:
    return f"127.0.0.1:{free_port()}"  # nothing listens there


def check_counts(stats: ProducerStats, address: str) -> None:
    assert (stats.published, stats.requests, stats.failed, stats.retried) == (203, 3, 0, 0)
    node = stats.nodes[address]
    assert (node.published, node.requests, node.errors, node.down) == (203, 3, 0, False)
    assert node.connections == stats.connections == 1
    assert node.pending == 0


@pytest.mark.anyio
async def test_producer_stats_count_messages_and_requests_per_nsqd(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("pstats")
    async with Producer([nsqd.tcp]) as producer:
        assert producer.stats().nodes[nsqd.tcp].published == 0
        await producer.publish(topic, b"one")
        await producer.publish(topic, b"later", delay=1)
        await producer.publish_many(topic, (b"m%d" % i for i in range(201)))  # a generator
        check_counts(producer.stats(), nsqd.tcp)


def test_sync_producer_stats_have_the_same_shape(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("spstats")
    with SyncProducer([nsqd.tcp]) as producer:
        producer.publish(topic, b"one")
        producer.publish(topic, b"later", delay=1)
        producer.publish_many(topic, (b"m%d" % i for i in range(201)))
        check_counts(producer.stats(), nsqd.tcp)


@pytest.mark.anyio
async def test_producer_stats_count_failures_and_retries(classic_cluster, anyio_backend):
    nsqd, dead = classic_cluster.nsqd[0], dead_address()
    topic = unique("pfail")
    async with Producer([dead], timeout=5, max_retries=2, retry_backoff=0.01) as producer:
        with pytest.raises(NSQError):
            await producer.publish(topic, b"x")
        with pytest.raises(NSQError):
            await producer.publish_many(topic, [b"a", b"b", b"c"])
        stats = producer.stats()
    assert (stats.published, stats.failed, stats.retried) == (0, 4, 4)
    # The start's attempt, then three per call, each failed to connect.
    assert stats.nodes[dead].errors == 7
    assert stats.nodes[dead].down
    # A failing node next to a working one: routed around, counted where it happened.
    async with Producer([dead, nsqd.tcp], timeout=5) as producer:
        for _ in range(4):
            await producer.publish(topic, b"y")
        stats = producer.stats()
    assert (stats.published, stats.failed) == (4, 0)
    assert stats.nodes[nsqd.tcp].published == 4
    assert stats.nodes[dead].errors >= 1 and stats.nodes[dead].published == 0


def test_sync_producer_stats_count_failures_and_retries(classic_cluster):
    dead = dead_address()
    with SyncProducer([dead], timeout=5, max_retries=1, retry_backoff=0.01) as producer:
        with pytest.raises(NSQError):
            producer.publish_many(unique("spfail"), [b"a", b"b"])
        stats = producer.stats()
    assert (stats.published, stats.failed, stats.retried) == (0, 2, 1)
    assert stats.nodes[dead].errors == 3 and stats.nodes[dead].down  # the start's, then 2


def lines(caplog: pytest.LogCaptureFixture, since: int, logger: str) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records[since:] if r.name == logger]


def at(records: list[tuple[int, str]], level: int) -> list[str]:
    return [m for lvl, m in records if lvl == level]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_outage_is_logged_once_per_state_change(cluster_factory, anyio_backend, caplog):
    cluster = cluster_factory("classic", nsqd=1)
    nsqd = cluster.nsqd[0]
    topic, ch = unique("logs"), "c"
    create_channel(nsqd.http, topic, ch)
    caplog.set_level(logging.DEBUG, logger="smartnsq")
    got: list[Message] = []

    async def handle(message: Message) -> None:
        got.append(message)

    async with (
        Producer([nsqd.tcp], timeout=2, max_retries=1, retry_backoff=0.01) as producer,
        Consumer(
            topic,
            ch,
            handle,
            nsqd_tcp_addresses=[nsqd.tcp],
            max_in_flight=50,
            reconnect_min=0.05,
            reconnect_max=0.2,
        ) as consumer,
    ):
        await wait_until(lambda: consumer.stats().connections == 1, 10, "subscribed")
        (up,) = at(lines(caplog, 0, "smartnsq.consumer"), logging.INFO)
        assert up.startswith(f"subscribed to {topic}/{ch} on nsqd {nsqd.tcp}")

        # 1000 messages: nothing at INFO or above, from anyone.
        mark = len(caplog.records)
        for i in range(10):
            await producer.publish_many(topic, [b"m%d" % j for j in range(i * 100, i * 100 + 100)])
        await wait_until(lambda: len(got) == 1000, 20, "1000 messages handled")
        await wait_until(lambda: consumer.stats().in_flight == 0, 10, "every message answered")
        # The producer connected on entry (at INFO, before the mark): nothing since.
        assert f"connected to nsqd {nsqd.tcp}" in at(
            lines(caplog, 0, "smartnsq.producer"), logging.INFO
        )
        noisy = [r.getMessage() for r in caplog.records[mark:] if r.levelno >= logging.INFO]
        assert noisy == []
        node = consumer.stats().nodes[nsqd.tcp]
        assert (node.received, node.in_flight, node.rdy) == (1000, 0, 50)

        # nsqd dies: one WARNING each, and the attempts after it at DEBUG.
        mark = len(caplog.records)
        await anyio.to_thread.run_sync(lambda: cluster.kill_nsqd(0, signal=signal.SIGKILL))
        for _ in range(3):
            with pytest.raises(NSQError):
                await producer.publish(topic, b"lost")
        await wait_until(
            lambda: len(at(lines(caplog, mark, "smartnsq.consumer"), logging.DEBUG)) >= 3,
            10,
            "reconnect attempts",
        )
        consumer_down = lines(caplog, mark, "smartnsq.consumer")
        producer_down = lines(caplog, mark, "smartnsq.producer")
        for records in consumer_down, producer_down:
            (warning,) = at(records, logging.WARNING)
            assert warning.startswith(f"nsqd {nsqd.tcp}: "), warning
            assert not at(records, logging.INFO) and not at(records, logging.ERROR)
        assert all("reconnecting (attempt" in m for m in at(consumer_down, logging.DEBUG))
        stats = producer.stats()
        assert stats.failed == 3 and stats.nodes[nsqd.tcp].down

        # nsqd is back: one INFO each.
        mark = len(caplog.records)
        await anyio.to_thread.run_sync(lambda: cluster.restart_nsqd(0))
        await wait_until(lambda: consumer.stats().connections == 1, 20, "subscribed again")
        with anyio.fail_after(10):
            while True:  # the producer's back-off may still hold off a first try
                try:
                    await producer.publish(topic, b"back")
                    break
                except NSQError:
                    await anyio.sleep(0.05)
        await wait_until(lambda: got[-1].body == b"back", 10, "the message after the restart")
        (back,) = at(lines(caplog, mark, "smartnsq.consumer"), logging.INFO)
        assert back.startswith(f"subscribed to {topic}/{ch} on nsqd {nsqd.tcp} again after")
        producer_up = lines(caplog, mark, "smartnsq.producer")
        ups = at(producer_up, logging.INFO)
        assert [m.split(" after ")[0] for m in ups] == [f"nsqd {nsqd.tcp} answers again"], ups
        assert not at(producer_up, logging.WARNING)
        assert not at(lines(caplog, mark, "smartnsq.consumer"), logging.WARNING)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_repeated_async_errors_are_logged_once_then_at_debug(
    classic_cluster, anyio_backend, caplog
):
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("finfail"), "c"
    create_channel(nsqd.http, topic, ch)
    caplog.set_level(logging.DEBUG, logger="smartnsq")
    held: list[Message] = []

    async def hold(message: Message) -> None:
        message.disable_auto_response()
        held.append(message)

    async with Producer([nsqd.tcp]) as producer:
        await producer.publish_many(topic, [b"a", b"b", b"c"])
    async with Consumer(
        topic, ch, hold, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=3, msg_timeout=1
    ) as consumer:
        await wait_until(lambda: len(held) == 3, 10, "three messages held")
        consumer.set_max_in_flight(0)

        def timed_out() -> bool:
            stats = channel_stats(nsqd.http, topic, ch) or {}
            return stats.get("timeout_count") == 3

        await wait_until(timed_out, 10, "nsqd timed the three out")
        for message in held:
            message.finish()  # nsqd answers E_FIN_FAILED to each
        await wait_until(
            lambda: sum("E_FIN_FAILED" in r.getMessage() for r in caplog.records) == 3,
            10,
            "three E_FIN_FAILED",
        )
    levels = [r.levelno for r in caplog.records if "E_FIN_FAILED" in r.getMessage()]
    assert levels == [logging.WARNING, logging.DEBUG, logging.DEBUG]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_backoff_is_logged_when_it_starts_and_ends(classic_cluster, anyio_backend, caplog):
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("backofflog"), "c"
    create_channel(nsqd.http, topic, ch)
    caplog.set_level(logging.DEBUG, logger="smartnsq.consumer")
    done: list[bytes] = []

    async def handle(message: Message) -> None:
        if message.body.startswith(b"f") and message.attempts == 1:
            raise RuntimeError("fails once")
        done.append(message.body)

    async with Producer([nsqd.tcp]) as producer:
        await producer.publish_many(topic, [b"f1", b"f2", b"ok1", b"ok2"])
    async with Consumer(
        topic,
        ch,
        handle,
        nsqd_tcp_addresses=[nsqd.tcp],
        requeue_delay=0,
        backoff_unit=0.05,
    ) as consumer:
        await wait_until(lambda: len(done) == 4, 20, "every message handled")
        await wait_until(lambda: consumer.stats().backoff_level == 0, 10, "backoff over")
    records = [(r.levelno, r.getMessage()) for r in caplog.records]
    starts = [m for lvl, m in records if lvl == logging.INFO and m.startswith("backing off")]
    ends = [m for lvl, m in records if lvl == logging.INFO and m.startswith("backoff over")]
    steps = [m for lvl, m in records if lvl == logging.DEBUG and m.startswith("backing off")]
    assert starts and len(starts) == len(ends), records
    assert all(m.endswith("(level 1)") for m in starts), starts
    if len(starts) == 1:  # nsqd delivered in order: f1, f2 fail in a row, then successes
        assert any(m.endswith("(level 2)") for m in steps), steps
