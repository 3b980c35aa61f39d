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
from tests.helpers import (
    channel_stats,
    create_channel,
    lookupds,
    topic_stats,
    unique,
    wait_for,
    wait_until,
)

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


def test_a_dead_letter_topic_needs_a_limit_of_attempts() -> None:
    # max_attempts=0 (no limit) gives nothing up: the dead-letter topic would never be used.
    with pytest.raises(InvalidArgument, match="max_attempts"):
        Consumer(
            "orders", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], max_attempts=0,
            dead_letter_topic="orders.dead",
        )  # fmt: skip


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
    # SIGTERM: nsqd saves its topics and channels in the background, so one SIGKILLed right
    # after the channel was created may come back without it.
    cluster.kill_nsqd(1, signal=signal.SIGTERM)
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


def in_flight(http: str, topic: str, channel: str) -> int:
    return int((channel_stats(http, topic, channel) or {}).get("in_flight_count") or 0)


def poison_first(handled: list[bytes]) -> Any:
    """A handler that fails for b"poison" only, and records what it handled."""

    async def handle(message: Message) -> None:
        if message.body == b"poison":
            raise ValueError("cannot handle the poison")
        handled.append(message.body)

    return handle


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_failing_copy_does_not_stall_healthy_messages(
    cluster_factory, anyio_backend, caplog
):
    # The most common deployment: lookupd only, with backoff. The dead-letter topic's only
    # nsqd is gone (lookupd still knows the topic): each copy fails for a transient reason.
    cluster = cluster_factory("classic", nsqd=2)
    source, sink = cluster.nsqd
    topic, dead = unique("dl"), unique("dl_dead")
    create_channel(source.http, topic, "c")
    create_channel(sink.http, dead, "d")
    cluster.kill_nsqd(1, signal=signal.SIGKILL)
    handled: list[bytes] = []
    caplog.set_level(logging.WARNING, "smartnsq.consumer")
    async with Producer([source.tcp]) as producer, Consumer(
        topic, "c", poison_first(handled), lookupd_http_addresses=lookupds(cluster),
        max_in_flight=4, max_attempts=1, requeue_delay=0, dead_letter_topic=dead,
    ) as consumer:  # fmt: skip
        await producer.publish(topic, b"poison")
        await wait_until(lambda: failed_copies(caplog) >= 1, 30, "a failed copy")
        healthy = [b"h%d" % i for i in range(8)]
        await producer.publish_many(topic, healthy)
        await wait_until(lambda: len(handled) == 8, 10, "the healthy messages")
        await wait_until(lambda: failed_copies(caplog) >= 3, 30, "more failed copies")
        assert consumer.stats().backoff_level == 0  # a failed copy is no handler failure
        assert consumer.stats().discarded == 0
        assert depth(source.http, topic, "c") == 1  # the poison, still kept


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_copy_the_dead_letter_nsqd_refuses_for_good_is_given_up(
    cluster_factory, anyio_backend, caplog
):
    # The dead-letter topic lives on an nsqd whose --max-msg-size is smaller than the message:
    # E_BAD_MESSAGE will not change with retries.
    cluster = cluster_factory("classic", nsqd=1)
    source = cluster.nsqd[0]
    sink = cluster.add_nsqd(["--max-msg-size=100"])
    topic, dead = unique("dl"), unique("dl_dead")
    create_channel(source.http, topic, "c")
    create_channel(sink.http, dead, "d")
    given_up: list[tuple[bytes, BaseException | None]] = []
    caplog.set_level(logging.WARNING, "smartnsq")
    async with Producer([source.tcp]) as producer:
        await producer.publish(topic, b"x" * 200)
    async with Consumer(
        topic, "c", failing("async", []), lookupd_http_addresses=lookupds(cluster),
        max_attempts=1, requeue_delay=0, backoff=False, dead_letter_topic=dead,
        on_giving_up=lambda m, reason: given_up.append((m.body, reason)),
    ) as consumer:  # fmt: skip
        await wait_until(lambda: given_up, 20, "the give-up")
        await wait_until(lambda: depth(source.http, topic, "c") == 0, 10, "an empty channel")
        assert consumer.stats().discarded == 1
    [(body, reason)] = given_up
    assert body == b"x" * 200 and "E_BAD_MESSAGE" in str(reason)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "E_BAD_MESSAGE" in errors[0].getMessage()
    assert failed_copies(caplog) == 0  # not retried
    assert depth(sink.http, dead, "d") == 0


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("slow_for", [1.5, 8.0])
async def test_a_graceful_stop_leaves_no_copy_in_flight(cluster_factory, anyio_backend, slow_for):
    # The dead-letter nsqd is stopped (SIGSTOP) while copies are pending: the stop waits for
    # them within its timeout (2 s here), and what is still pending then is requeued.
    cluster = cluster_factory("classic", nsqd=2)
    source, sink = cluster.nsqd
    topic, dead = unique("dl"), unique("dl_dead")
    create_channel(source.http, topic, "c")
    create_channel(sink.http, dead, "d")
    async with Producer([source.tcp]) as producer:
        await producer.publish_many(topic, [b"m%d" % i for i in range(N)])
    consumer = giving_up_at_once(cluster, topic, dead)
    sink.signal(signal.SIGSTOP)
    try:
        async with consumer:
            await wait_until(lambda: consumer.stats().received >= 2 * N, 10, "the give-ups")
            with anyio.CancelScope() as resume:
                async with anyio.create_task_group() as tg:

                    async def cont() -> None:
                        await anyio.sleep(slow_for)  # how long the fault lasts
                        sink.signal(signal.SIGCONT)

                    tg.start_soon(cont)
                    started = anyio.current_time()
                    await consumer.stop(timeout=2.0)
                    took = anyio.current_time() - started
                    if slow_for > 2.0:
                        assert 2.0 <= took < 4.0  # waited for the copies, then gave them back
                        assert in_flight(source.http, topic, "c") == 0  # nothing left in flight
                    resume.cancel()
    finally:
        sink.signal(signal.SIGCONT)
    if slow_for < 2.0:
        assert 1.0 <= took < 2.0  # waited for the copies
        assert depth(source.http, topic, "c") == 0  # each finished once copied
        assert depth(sink.http, dead, "d") == N
    else:
        assert in_flight(source.http, topic, "c") == 0
        await wait_until(lambda: depth(source.http, topic, "c") == N, 5, "requeued originals")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_stops_amid_a_flow_of_given_up_messages_do_not_wait_for_nothing(
    classic_cluster, anyio_backend, caplog
):
    # A copy asked for in a read callback starts in a task a moment later; a stop that
    # comes in between once left it never started yet counted as pending: the stop waited
    # its whole timeout for it. The dead-letter nsqd is healthy here: no stop should wait.
    nsqd = classic_cluster.nsqd[0]
    topic, dead = unique("dlflow"), unique("dlflow_dead")
    create_channel(nsqd.http, topic, "c")
    create_channel(nsqd.http, dead, "d")
    async with Producer([nsqd.tcp]) as producer:
        for _ in range(20):
            await producer.publish_many(topic, [b"x"] * 5000)
    caplog.set_level(logging.WARNING, "smartnsq.consumer")
    took = []
    for _ in range(12):
        consumer = Consumer(
            topic, "c", failing("async", []), nsqd_tcp_addresses=[nsqd.tcp],
            max_in_flight=200, max_attempts=1, requeue_delay=0, backoff=False,
            dead_letter_topic=dead,
        )  # fmt: skip
        async with consumer:
            await wait_until(lambda: consumer.stats().discarded >= 500, 20, "give-ups")  # noqa: B023
            started = anyio.current_time()
            await consumer.stop(timeout=3.0)
            took.append(anyio.current_time() - started)
    assert max(took) < 2.0, took
    assert not any("still unacknowledged" in r.getMessage() for r in caplog.records)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_second_stop_cuts_the_wait_for_pending_copies(
    cluster_factory, anyio_backend, caplog
):
    # As on a second Ctrl-C: the wait for copies is cut short, and the log says how long it
    # really waited.
    cluster = cluster_factory("classic", nsqd=2)
    source, sink = cluster.nsqd
    topic, dead = unique("dl"), unique("dl_dead")
    create_channel(source.http, topic, "c")
    create_channel(sink.http, dead, "d")
    async with Producer([source.tcp]) as producer:
        await producer.publish_many(topic, [b"m%d" % i for i in range(N)])
    consumer = giving_up_at_once(cluster, topic, dead)
    caplog.set_level(logging.WARNING, "smartnsq.consumer")
    sink.signal(signal.SIGSTOP)
    try:
        async with consumer:
            await wait_until(lambda: consumer.stats().received >= 2 * N, 10, "the give-ups")
            started = anyio.current_time()
            async with anyio.create_task_group() as tg:
                tg.start_soon(consumer.stop, 60.0)
                await anyio.sleep(0.5)
                await consumer.stop(timeout=0.0)
            took = anyio.current_time() - started
            assert in_flight(source.http, topic, "c") == 0
    finally:
        sink.signal(signal.SIGCONT)
    assert took < 3.0
    [warning] = [r.getMessage() for r in caplog.records if "still unacknowledged" in r.getMessage()]
    waited = float(warning.split(" after ")[1].split(" s;")[0])
    assert 0.5 <= waited < 3.0  # not the first stop's 60 s


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_youzan_ordered_partition_dead_letters_the_poison_and_moves_on(
    youzan_cluster, anyio_backend, kind
):
    topic, dead = unique("dlo"), unique("dlo_dead")
    create_topic(youzan_cluster, topic, partitions=1, replicas=1, ordered=True, channel="c")
    create_topic(youzan_cluster, dead, partitions=1, replicas=1, channel="d")
    bodies = [b"poison"] + [b"h%d" % i for i in range(4)]
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        for body in bodies:
            await producer.publish(topic, body, sharding_key="k")
    handled: list[bytes] = []
    attempts: list[int] = []
    given_up: list[bytes] = []

    def handle_sync(message: Message) -> None:
        if message.body == b"poison":
            attempts.append(message.attempts)
            raise ValueError("cannot handle the poison")
        handled.append(message.body)

    async def handle(message: Message) -> None:
        handle_sync(message)

    async with Consumer(
        topic, "c", handle if kind == "async" else handle_sync,
        lookupd_http_addresses=lookupds(youzan_cluster),
        max_attempts=3, requeue_delay=0, dead_letter_topic=dead,
        on_giving_up=lambda m: given_up.append(m.body),
    ):  # fmt: skip
        await wait_until(lambda: len(handled) == 4, 30, "the rest of the partition")
    assert handled == bodies[1:]  # in order, after the poison was dead-lettered
    assert attempts == [1, 2, 3] and given_up == [b"poison"]
    reader = Consumer(dead, "d", lookupd_http_addresses=lookupds(youzan_cluster))
    async with reader:
        with anyio.fail_after(30):
            copy = await reader.__anext__()
    assert copy.body == b"poison"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_youzan_a_missing_dead_letter_topic_is_an_error_at_start(
    youzan_cluster, anyio_backend
):
    from smartnsq.errors import TopicNotFound

    topic = unique("dlm")
    create_topic(youzan_cluster, topic, partitions=1, replicas=1, ordered=True, channel="c")
    consumer = Consumer(
        topic, "c", failing("async", []), lookupd_http_addresses=lookupds(youzan_cluster),
        dead_letter_topic=unique("dlm_missing"),
    )  # fmt: skip
    with anyio.fail_after(10), pytest.raises(TopicNotFound, match="dead_letter_topic"):
        async with consumer:
            pass


def apart(cluster: Any, prefix: str, ordered: bool) -> tuple[str, str, int]:
    """A one-partition source topic and its dead-letter topic, led by different nsqd (lookupd
    picks the leaders: topics are made until the source is on the other one); the index of
    the dead-letter topic's nsqd."""
    node = {n.http: i for i, n in enumerate(cluster.nsqd)}

    def leader(info: dict[str, Any]) -> int:
        [n] = info["partitions"].values()
        return node[f"{n['broadcast_address']}:{n['http_port']}"]

    topic, dead = unique(prefix), unique(f"{prefix}_dead")
    sink = leader(create_topic(cluster, dead, partitions=1, replicas=1, channel="d"))
    while leader(create_topic(cluster, topic, 1, 1, ordered=ordered, channel="c")) == sink:
        topic = unique(prefix)
    return topic, dead, sink


@pytest.mark.slow  # about a minute: the fork takes its time to make the restarted nsqd writable
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_youzan_ordered_partition_waits_for_a_failing_copy_without_spinning(
    cluster_factory, anyio_backend, caplog
):
    cluster = cluster_factory("youzan", nsqd=2)
    topic, dead, sink = apart(cluster, "dlo", ordered=True)
    bodies = [b"poison", b"h0", b"h1"]
    async with Producer(lookupd_http_addresses=lookupds(cluster)) as producer:
        for body in bodies:
            await producer.publish(topic, body, sharding_key="k")
    handled: list[bytes] = []
    cluster.kill_nsqd(sink, signal=signal.SIGTERM)
    caplog.set_level(logging.WARNING, "smartnsq.consumer")
    async with Consumer(
        topic, "c", poison_first(handled), lookupd_http_addresses=lookupds(cluster),
        max_attempts=1, requeue_delay=0, backoff=False, dead_letter_topic=dead,
    ):  # fmt: skip
        await wait_until(lambda: failed_copies(caplog) >= 2, 30, "failed copies")
        started = time.monotonic()
        await wait_until(lambda: failed_copies(caplog) >= 4, 30, "more failed copies")
        # held 2 s, then 4 s between tries: no spinning, and nothing overtook the poison
        assert time.monotonic() - started >= 5.0
        assert handled == []
        cluster.restart_nsqd(sink)
        await wait_until(lambda: handled == bodies[1:], 120, "the partition moving on")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_youzan_a_stop_does_not_wait_for_an_ordered_message_held_between_copies(
    cluster_factory, anyio_backend, caplog
):
    # Between two failed copies an ordered message is held, not copied: a graceful stop
    # gives it back at once instead of waiting out the hold (up to stop_timeout).
    cluster = cluster_factory("youzan", nsqd=2)
    topic, dead, sink = apart(cluster, "dlo", ordered=True)
    source = cluster.nsqd[1 - sink]
    async with Producer(lookupd_http_addresses=lookupds(cluster)) as producer:
        await producer.publish(topic, b"poison", sharding_key="k")
    cluster.kill_nsqd(sink, signal=signal.SIGTERM)
    caplog.set_level(logging.WARNING, "smartnsq.consumer")
    consumer = Consumer(
        topic, "c", poison_first([]), lookupd_http_addresses=lookupds(cluster),
        max_attempts=1, requeue_delay=0, backoff=False, dead_letter_topic=dead,
    )  # fmt: skip
    async with consumer:
        await wait_until(lambda: failed_copies(caplog) >= 3, 30, "failed copies")  # held 4 s
        started = anyio.current_time()
        await consumer.stop(timeout=10.0)
        took = anyio.current_time() - started
    assert took < 2.0
    assert not any("still unacknowledged" in r.getMessage() for r in caplog.records)
    assert in_flight(source.http, topic, "c") == 0  # given back, not left in flight


@pytest.mark.slow  # about a minute: the paused fork takes its time to redeliver and copy
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_youzan_a_refused_fin_after_a_slow_copy_is_not_taken_from_finished(
    cluster_factory, anyio_backend
):
    # The copy outlasts the message's timeout, so nsqd refuses the FIN that follows it. That
    # FIN was never counted as finished (the message was given up on): the fork names the
    # message as a byte list ("FIN [0 0 ... 2 ...] failed"), which must still be recognised.
    cluster = cluster_factory("youzan", nsqd=2)
    topic, dead, at = apart(cluster, "dlr", ordered=False)
    sink = cluster.nsqd[at]
    async with Producer(lookupd_http_addresses=lookupds(cluster)) as producer:
        await producer.publish(topic, b"poison")
    consumer = Consumer(
        topic, "c", failing("async", []), lookupd_http_addresses=lookupds(cluster),
        max_attempts=1, requeue_delay=0, backoff=False, dead_letter_topic=dead, msg_timeout=1,
    )  # fmt: skip
    sink.signal(signal.SIGSTOP)
    try:
        async with consumer:
            # given up on, its copy stuck: the original times out and comes again
            await wait_until(lambda: consumer.stats().received >= 3, 20, "a redelivery")
            sink.signal(signal.SIGCONT)
            await wait_until(lambda: consumer.stats().refused >= 1, 20, "a refused FIN")
            await wait_until(lambda: consumer.stats().discarded >= 1, 20, "a copy")
            stats = consumer.stats()
            assert stats.finished == 0 and stats.requeued >= 1  # given up: never "finished"
    finally:
        sink.signal(signal.SIGCONT)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_message_over_one_mib_is_copied_when_nsqd_takes_it(cluster_factory, anyio_backend):
    # nsqd's --max-msg-size decides, not the Producer's default max_message_size (1 MiB).
    cluster = cluster_factory("classic", nsqd_args=["--max-msg-size=3000000"])
    nsqd = cluster.nsqd[0]
    topic, dead = unique("dl"), unique("dl_dead")
    create_channel(nsqd.http, topic, "c")
    create_channel(nsqd.http, dead, "d")
    big = b"b" * 1_500_000
    async with Producer([nsqd.tcp], max_message_size=2_000_000) as producer:
        await producer.publish(topic, big)

    async def handle(message: Message) -> None:
        raise ValueError("cannot handle it")  # not the body: it is 1.5 MB

    async with Consumer(
        topic, "c", handle, nsqd_tcp_addresses=[nsqd.tcp], max_attempts=1, requeue_delay=0,
        backoff=False, dead_letter_topic=dead,
    ) as consumer:  # fmt: skip
        await wait_until(lambda: depth(nsqd.http, dead, "d") == 1, 20, "the copy")
        await wait_until(lambda: depth(nsqd.http, topic, "c") == 0, 10, "an empty channel")
        assert consumer.stats().discarded == 1


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_dead_letter_topic_that_does_not_exist_yet_is_created(
    classic_cluster, anyio_backend
):
    # The most common deployment: lookupd only, and nobody created the dead-letter topic.
    nsqd = classic_cluster.nsqd[0]
    topic, dead = unique("dl"), unique("dl_dead")
    create_channel(nsqd.http, topic, "c")
    async with Producer([nsqd.tcp]) as producer:
        await producer.publish_many(topic, [b"m%d" % i for i in range(N)])
    async with giving_up_at_once(classic_cluster, topic, dead) as consumer:
        await wait_until(lambda: consumer.stats().discarded == N, 20, "the dead letters")
        await wait_until(lambda: depth(nsqd.http, topic, "c") == 0, 10, "an empty channel")
    assert (topic_stats(nsqd.http, dead) or {}).get("message_count") == N
