"""Dead-letter topics against real nsqd: classic (facts logged) and Youzan ext topics (facts
in the copy's headers); nothing is lost while the dead-letter topic cannot be written."""

from __future__ import annotations

import logging
import signal
import time
from typing import Any

import anyio
import pytest

from compat.youzan import create_topic
from smartnsq import Consumer, Message, Producer
from smartnsq import sync as nsq_sync
from smartnsq.errors import InvalidArgument
from smartnsq.lag import channel_lag
from tests.helpers import channel_stats, create_channel, lookupds, unique, wait_for, wait_until

pytestmark = [pytest.mark.integration]

N = 5


def depth(http: str, topic: str, channel: str) -> int:
    """Messages of the channel not consumed yet: waiting, in flight or deferred."""
    c = channel_stats(http, topic, channel) or {}
    return sum(int(c.get(k) or 0) for k in ("depth", "in_flight_count", "deferred_count"))


def youzan_depth(http: str, topic: str, channel: str) -> int:
    """The fork's channel depth already counts the messages in flight and deferred."""
    return int((channel_stats(http, topic, channel) or {}).get("depth") or 0)


def failing(kind: str, seen: list[int]) -> Any:
    if kind == "async":

        async def handle(message: Message) -> None:
            seen.append(message.attempts)
            raise ValueError(f"cannot handle {message.body!r}")

        return handle

    def handle_sync(message: Message) -> None:
        seen.append(message.attempts)
        raise ValueError(f"cannot handle {message.body!r}")

    return handle_sync


def giving_up_at_once(cluster: Any, topic: str, dead: str) -> Consumer:
    """A consumer of ``topic``/c through lookupd whose handler always fails and which gives
    up at the first attempt: every message goes for ``dead``."""
    return Consumer(
        topic, "c", failing("async", []), lookupd_http_addresses=lookupds(cluster),
        max_in_flight=N, max_attempts=1, requeue_delay=0, backoff=False,
        dead_letter_topic=dead,
    )  # fmt: skip


def failed_copies(caplog: pytest.LogCaptureFixture) -> int:
    """Dead-letter copies that failed, each original requeued instead of finished."""
    return sum("requeued, not finished" in r.message for r in caplog.records)


def test_the_dead_letter_topic_is_checked() -> None:
    with pytest.raises(InvalidArgument, match="must differ"):
        Consumer("orders", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], dead_letter_topic="orders")
    with pytest.raises(InvalidArgument):
        Consumer("orders", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], dead_letter_topic="a b")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_given_up_messages_go_to_the_dead_letter_topic(
    classic_cluster, anyio_backend, kind, caplog
):
    nsqd = classic_cluster.nsqd[0]
    topic, dead = unique("dl"), unique("dl_dead")
    create_channel(nsqd.http, topic, "c")
    create_channel(nsqd.http, dead, "d")
    bodies = [b"m%d" % i for i in range(N)]
    async with Producer([nsqd.tcp]) as producer:
        await producer.publish_many(topic, bodies)
    seen: list[int] = []
    given_up: list[bytes] = []
    caplog.set_level(logging.WARNING, "smartnsq")
    async with Consumer(
        topic, "c", failing(kind, seen), nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=N,
        max_attempts=2, requeue_delay=0, backoff=False, dead_letter_topic=dead,
        on_giving_up=lambda m: given_up.append(m.body),
    ) as consumer:  # fmt: skip
        await wait_until(lambda: depth(nsqd.http, dead, "d") == N, 20, "the dead letters")
        await wait_until(lambda: depth(nsqd.http, topic, "c") == 0, 10, "an empty channel")
        assert consumer.stats().discarded == N
    assert sorted(given_up) == bodies
    assert sorted(seen) == [1] * N + [2] * N  # handled twice each, then given up
    copies = [r for r in caplog.records if "dead letter:" in r.getMessage()]
    assert len(copies) == N  # classic: no headers, so the facts are logged once each
    assert "ValueError: cannot handle" in copies[0].getMessage()
    async with Consumer(dead, "d", nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=N) as reader:
        got = []
        with anyio.fail_after(10):
            async for message in reader:
                got.append(message.body)
                if len(got) == N:
                    break
    assert sorted(got) == bodies  # the bodies, unchanged


def test_the_blocking_consumer_too(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic, dead = unique("dl"), unique("dl_dead")
    create_channel(nsqd.http, topic, "c")
    create_channel(nsqd.http, dead, "d")
    with nsq_sync.Producer([nsqd.tcp]) as producer:
        producer.publish_many(topic, [b"x"] * N)
    consumer = nsq_sync.Consumer(
        topic, "c", failing("sync", []), nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=N,
        max_attempts=1, requeue_delay=0, backoff=False, dead_letter_topic=dead,
    )  # fmt: skip
    with consumer:
        wait_for(lambda: depth(nsqd.http, dead, "d") == N, 20, "the dead letters")
        wait_for(lambda: depth(nsqd.http, topic, "c") == 0, 10, "an empty channel")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_nothing_is_lost_while_the_dead_letter_nsqd_is_down(
    cluster_factory, anyio_backend, caplog
):
    cluster = cluster_factory("classic", nsqd=2)
    source, sink = cluster.nsqd
    topic, dead = unique("dl"), unique("dl_dead")
    create_channel(source.http, topic, "c")
    create_channel(sink.http, dead, "d")  # the dead-letter topic lives on the other nsqd
    async with Producer([source.tcp]) as producer:
        await producer.publish_many(topic, [b"m%d" % i for i in range(N)])
    cluster.kill_nsqd(1, signal=signal.SIGKILL)
    caplog.set_level(logging.WARNING, "smartnsq.consumer")
    async with giving_up_at_once(cluster, topic, dead):
        await wait_until(lambda: failed_copies(caplog) >= 2 * N, 30, "failed copies")
        # Given up on and requeued again and again: every one still in the source topic.
        assert depth(source.http, topic, "c") == N
        cluster.restart_nsqd(1)
        await wait_until(lambda: depth(sink.http, dead, "d") >= N, 60, "the dead letters")
        await wait_until(lambda: depth(source.http, topic, "c") == 0, 10, "an empty channel")
    lag = await channel_lag(dead, "d", nsqd_http_addresses=[sink.http])
    assert lag[0].messages is not None and lag[0].messages >= N  # at least once


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_youzan_ext_copies_keep_headers_and_trace_id_and_say_what_happened(
    youzan_cluster, anyio_backend
):
    topic, dead = unique("dl"), unique("dl_dead")
    for name in (topic, dead):
        create_topic(youzan_cluster, name, partitions=1, replicas=1, ext=True, channel="ch")
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        sent = await producer.publish(topic, b"body", headers={"k": "v"}, trace_id=77)
    assert sent is not None
    before = time.time() * 1000
    failing_consumer = Consumer(
        topic, "ch", failing("async", []), lookupd_http_addresses=lookupds(youzan_cluster),
        max_attempts=2, requeue_delay=0, backoff=False, dead_letter_topic=dead,
    )  # fmt: skip
    reader = Consumer(dead, "ch", lookupd_http_addresses=lookupds(youzan_cluster))
    async with failing_consumer, reader:
        with anyio.fail_after(30):
            copy = await reader.__anext__()
    assert copy.body == b"body"
    headers = copy.headers
    assert headers["k"] == "v" and copy.trace_id == 77
    assert headers["smartnsq.dead.topic"] == topic
    assert headers["smartnsq.dead.channel"] == "ch"
    assert headers["smartnsq.dead.attempts"] == "3"
    assert headers["smartnsq.dead.error"] == "ValueError: cannot handle b'body'"
    assert before <= int(headers["smartnsq.dead.failed_at"]) <= time.time() * 1000
    assert headers["smartnsq.dead.message_id"] == str(sent.internal_id)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_youzan_nothing_is_lost_while_the_dead_letter_leader_is_down(
    cluster_factory, anyio_backend, caplog
):
    cluster = cluster_factory("youzan", nsqd=2)
    node = {n.http: i for i, n in enumerate(cluster.nsqd)}

    def leaders(info: dict[str, Any]) -> dict[int, int]:
        """Partition -> index of the nsqd leading it."""
        return {
            int(p): node[f"{n['broadcast_address']}:{n['http_port']}"]
            for p, n in info["partitions"].items()
        }

    topic, dead = unique("dl"), unique("dl_dead")
    sink = leaders(create_topic(cluster, dead, partitions=1, replicas=1, ext=True, channel="d"))[0]
    # Two partitions on two nsqd: one on each. lookupd picks the leaders, so only the
    # partition away from the dead-letter topic's nsqd gets the messages.
    source_leaders = leaders(create_topic(cluster, topic, partitions=2, replicas=1, channel="c"))
    live = next(p for p, i in source_leaders.items() if i != sink)
    source = cluster.nsqd[1 - sink].http
    bodies = [b"m%d" % i for i in range(N)]
    async with Producer(lookupd_http_addresses=lookupds(cluster)) as producer:
        await producer.publish_many(topic, bodies, partition=live)
    # SIGTERM: a single-replica partition whose nsqd was SIGKILLed may stay unwritable for
    # minutes after the restart (compat/README.md), which is the fork's recovery, not ours.
    cluster.kill_nsqd(sink, signal=signal.SIGTERM)
    caplog.set_level(logging.WARNING, "smartnsq.consumer")
    async with giving_up_at_once(cluster, topic, dead):
        await wait_until(lambda: failed_copies(caplog) >= 2 * N, 30, "failed copies")
        # Given up on and requeued again and again: every one still in the source topic.
        assert youzan_depth(source, topic, "c") == N
        cluster.restart_nsqd(sink)
        await wait_until(
            lambda: youzan_depth(cluster.nsqd[sink].http, dead, "d") >= N, 90, "the copies"
        )
        await wait_until(lambda: youzan_depth(source, topic, "c") == 0, 10, "an empty channel")
    got: dict[bytes, dict[str, str]] = {}
    async with Consumer(dead, "d", lookupd_http_addresses=lookupds(cluster)) as reader:
        with anyio.fail_after(30):
            async for message in reader:  # at least once: a copy may come twice
                got[message.body] = message.headers
                if len(got) == N:
                    break
    assert sorted(got) == bodies  # none lost, bodies unchanged
    assert all(h["smartnsq.dead.topic"] == topic for h in got.values())
