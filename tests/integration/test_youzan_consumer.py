"""Partition-aware and ordered consumption against the real Youzan HA cluster."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import signal
import time
from collections import defaultdict

import anyio
import pytest

from compat.youzan import create_topic
from smartnsq import Consumer, Message, Producer
from smartnsq.errors import SubOrderRequired
from smartnsq.net.transport import AsyncioLink
from smartnsq.trace import JsonFormatter
from tests.helpers import lookupds, unique, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
]


async def test_ordered_topic_keys_stay_in_order(youzan_cluster, anyio_backend):
    """4 partitions, 200 keys, 20,000 messages from 4 concurrent producers."""
    topic = unique("ord")
    create_topic(youzan_cluster, topic, partitions=4, replicas=1, ordered=True, channel="ch")
    keys = [f"key-{k}" for k in range(200)]
    per_key = 25  # x 200 keys = 5,000 per producer... split over 4 producers below
    sent: dict[str, list[int]] = defaultdict(list)

    async def producer_task(index: int) -> None:
        async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
            for k in keys[index::4]:  # each producer owns 50 keys, so per-key order is defined
                bodies = []
                for seq in range(per_key * 4):
                    bodies.append(f"{k}:{seq}".encode())
                    sent[k].append(seq)
                for body in bodies:
                    await producer.publish(topic, body, sharding_key=k)

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(producer_task, i)
    total = sum(len(v) for v in sent.values())
    assert total == 20_000

    seen: dict[str, list[int]] = defaultdict(list)
    offsets: dict[int, list[int]] = defaultdict(list)
    count = 0
    done = anyio.Event()
    violations: list[Message] = []

    def handle(message: Message) -> None:
        nonlocal count
        key, seq = message.body.decode().rsplit(":", 1)
        if seen[key] and seen[key][-1] == int(seq):
            return  # a redelivery of the last one (allowed)
        seen[key].append(int(seq))
        assert message.offset is not None and message.partition is not None
        offsets[message.partition].append(message.offset)
        count += 1
        if count >= total:
            done.set()

    async with Consumer(
        topic,
        "ch",
        handle,
        lookupd_http_addresses=lookupds(youzan_cluster),
        max_in_flight=16,
        on_order_violation=lambda m, i, o: violations.append(m),
    ) as consumer:
        with anyio.fail_after(120):
            await done.wait()
        stats = consumer.stats()
    assert stats.connections == 4
    assert not violations
    for key in keys:
        assert seen[key] == sent[key], key
    for partition, offs in offsets.items():
        assert offs == sorted(offs), f"offsets went backwards in partition {partition}"


async def test_ordered_async_handler_that_has_to_wait(youzan_cluster, anyio_backend):
    """An ordered message's handling starts in the read callback, as an idle worker; one
    that has to wait is finished by that worker. Either way the handler runs in a worker
    task (anyio's cancel scopes work) and in the worker's context, and its answer is the one
    sent: every message handled once, in order, a failure or False redelivered."""
    topic = unique("ordh")
    create_topic(youzan_cluster, topic, partitions=2, replicas=1, ordered=True, channel="ch")
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        for n in range(300):
            await producer.publish(topic, b"%d" % n, sharding_key=f"k{n % 8}")

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="")
    var.set("set before the consumer started")
    handled: dict[int, list[int]] = defaultdict(list)
    attempts: dict[int, list[int]] = defaultdict(list)
    tasks: set[object] = set()
    contexts: set[str] = set()
    done = anyio.Event()

    async def handle(message: Message) -> bool:
        n = int(message.body)
        attempts[n].append(message.attempts)
        tasks.add(asyncio.current_task())
        contexts.add(var.get())
        with anyio.fail_after(10):
            if n % 3 == 0:
                await anyio.sleep(0)  # has to wait: the worker takes over
            if n % 7 == 0 and message.attempts == 1:
                raise RuntimeError("the first attempt fails")
            if n % 11 == 0 and message.attempts == 1:
                return False
        assert message.partition is not None
        handled[message.partition].append(n)
        if sum(map(len, handled.values())) == 300:
            done.set()
        return True

    async with Consumer(
        topic,
        "ch",
        handle,
        lookupd_http_addresses=lookupds(youzan_cluster),
        max_in_flight=4,
        concurrency=2,
        backoff_unit=0.001,
    ):
        with anyio.fail_after(60):
            await done.wait()

    assert sorted(n for ns in handled.values() for n in ns) == list(range(300))
    for ns in handled.values():
        assert ns == sorted(ns)  # one producer, in turn: publish order
    assert all(a == ([1, 2] if n % 7 == 0 or n % 11 == 0 else [1]) for n, a in attempts.items())
    assert None not in tasks and len(tasks) <= 2
    assert contexts == {"set before the consumer started"}


@pytest.mark.parametrize("kind", ["async", "thread"])
async def test_a_slow_ordered_handler_never_runs_twice_at_once(
    youzan_cluster, anyio_backend, kind, caplog
):
    """A handler longer than nsqd's message timeout: the fork sent the message again while
    the first run went on, and the copy was handled too, beside it (two handlers on one
    partition, the copy's FIN refused). The consumer keeps an ordered message alive (TOUCH)
    and drops a copy of the message in progress."""
    topic = unique("slow")
    create_topic(youzan_cluster, topic, partitions=2, replicas=1, ordered=True, channel="ch")
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        for n in range(4):
            await producer.publish(topic, b"%d" % n, partition=n % 2)

    calls: list[tuple[int | None, int | None, int]] = []
    running: dict[int | None, int] = defaultdict(int)
    overlaps: list[int | None] = []

    def begin(message: Message) -> None:
        calls.append((message.partition, message.offset, message.attempts))
        if running[message.partition]:
            overlaps.append(message.partition)
        running[message.partition] += 1

    async def handle_async(message: Message) -> None:
        begin(message)
        await anyio.sleep(3.0)
        running[message.partition] -= 1

    def handle_in_a_thread(message: Message) -> None:
        begin(message)  # a list append and a dict update: safe from a thread here
        time.sleep(3.0)
        running[message.partition] -= 1

    caplog.set_level(logging.WARNING, logger="smartnsq.consumer")
    async with Consumer(
        topic,
        "ch",
        handle_async if kind == "async" else handle_in_a_thread,
        lookupd_http_addresses=lookupds(youzan_cluster),
        max_in_flight=2,
        msg_timeout=2,
    ) as consumer:
        # Each run outlasts the timeout: a copy would come while it runs, before its FIN.
        await wait_until(lambda: consumer.stats().finished == 4, 30, "4 messages finished")
        stats = consumer.stats()
    assert not overlaps
    assert sorted(calls) == sorted({(p, o, 1) for p, o, _ in calls}) and len(calls) == 4
    assert (stats.received, stats.finished, stats.requeued) == (4, 4, 0)
    assert not [r for r in caplog.records if "E_FIN_FAILED" in r.getMessage()]


async def test_backoff_probe_moves_on_from_a_partition_with_nothing_to_send(
    youzan_cluster, anyio_backend
):
    """After a backoff window one connection gets RDY 1 to test the waters. When its
    partition has nothing to send, no result ever ends the backoff: the probe has to move to
    another connection (it went to one at random and stayed, and the consumer stalled)."""
    topic = unique("probe")
    create_topic(youzan_cluster, topic, partitions=2, replicas=1, ordered=True, channel="ch")
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        await producer.publish_many(topic, [b"%d" % n for n in range(30)], partition=0)

    handled: list[int] = []
    done = anyio.Event()

    async def handle(message: Message) -> None:
        n = int(message.body)
        if n < 6 and message.attempts == 1:
            raise RuntimeError("the first attempt fails")  # six backoff windows
        handled.append(n)
        if len(set(handled)) == 30:
            done.set()

    async with Consumer(
        topic,
        "ch",
        handle,
        lookupd_http_addresses=lookupds(youzan_cluster),
        backoff_unit=0.01,
    ) as consumer:
        with anyio.fail_after(60):
            await done.wait()
        assert consumer.stats().connections == 2
    assert sorted(set(handled)) == list(range(30))


async def test_blocked_ordered_partition_is_reported_and_holds_the_rest(
    youzan_cluster, anyio_backend, caplog
):
    topic = unique("blk")
    create_topic(youzan_cluster, topic, partitions=1, replicas=1, ordered=True, channel="ch")
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        for body in (b"first", b"second"):
            await producer.publish(topic, body, sharding_key="k")

    handled: list[tuple[bytes, int]] = []
    blocked: list[tuple[bytes, int]] = []
    done = anyio.Event()

    def handle(message: Message) -> None:
        handled.append((message.body, message.attempts))
        if message.body == b"first" and message.attempts < 4:
            raise RuntimeError("not yet")  # REQ: an ordered channel redelivers it at once
        if message.body == b"second":
            done.set()

    caplog.set_level(logging.WARNING, logger="smartnsq.consumer")
    async with Consumer(
        topic,
        "ch",
        handle,
        lookupd_http_addresses=lookupds(youzan_cluster),
        max_attempts=0,
        backoff_unit=0.01,
        blocked_warn_attempts=2,
        blocked_error_attempts=3,
        on_blocked=lambda m: blocked.append((m.body, m.attempts)),
    ):
        with anyio.fail_after(60):
            await done.wait()

    # Nothing after the failing message arrived until it was finally handled.
    firsts = [a for body, a in handled if body == b"first"]
    assert firsts == [1, 2, 3, 4]
    second_at = [body for body, _ in handled].index(b"second")
    assert all(body == b"first" for body, _ in handled[:second_at])
    assert sorted({a for body, a in blocked if body == b"first"}) == [2, 3, 4]
    levels = {r.levelno for r in caplog.records if "is blocked" in r.getMessage()}
    assert levels == {logging.WARNING, logging.ERROR}


async def test_ordered_channel_created_ahead_delivers_the_first_message_once(
    youzan_cluster, anyio_backend
):
    """create_topic sets the channel's order before anything is published; else the fork,
    turning the channel ordered on the first SUB_ORDERED, delivers its first message twice."""
    topic = unique("first")
    create_topic(youzan_cluster, topic, partitions=1, replicas=1, ordered=True, channel="ch")
    bodies = [b"m%d" % i for i in range(5)]
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        for body in bodies:
            await producer.publish(topic, body, sharding_key="k")
    got: list[tuple[bytes, int]] = []
    done = anyio.Event()

    def handle(message: Message) -> None:
        got.append((message.body, message.attempts))
        if message.body == bodies[-1]:
            done.set()

    async with Consumer(topic, "ch", handle, lookupd_http_addresses=lookupds(youzan_cluster)):
        with anyio.fail_after(30):
            await done.wait()
    assert got == [(body, 1) for body in bodies]


async def test_ordered_answers_leave_at_once_without_rdy_top_ups(
    youzan_cluster, anyio_backend, monkeypatch
):
    """One message in flight per ordered partition: each FIN goes to the socket as soon as
    the handler returns (not after another loop pass, coalesced with nothing), and no RDY is
    re-sent per message (nsqd's RDY is a window, not a credit)."""
    topic = unique("fast")
    create_topic(youzan_cluster, topic, partitions=2, replicas=1, ordered=True, channel="ch")
    n = 200
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        for i in range(n):
            await producer.publish(topic, b"%d" % i, sharding_key=i % 10)
    deferred: list[bytes] = []
    at_once: list[bytes] = []
    write, write_now = AsyncioLink.write, AsyncioLink.write_now

    def record_write(self: AsyncioLink, data: bytes) -> None:
        deferred.append(data)
        write(self, data)

    def record_write_now(self: AsyncioLink, data: bytes) -> None:
        at_once.append(data)
        write_now(self, data)

    monkeypatch.setattr(AsyncioLink, "write", record_write)
    monkeypatch.setattr(AsyncioLink, "write_now", record_write_now)
    got: set[bytes] = set()
    done = anyio.Event()

    async def handle(message: Message) -> None:
        got.add(message.body)
        if len(got) == n:
            done.set()

    async with Consumer(
        topic, "ch", handle, lookupd_http_addresses=lookupds(youzan_cluster), max_in_flight=8
    ):
        with anyio.fail_after(30):
            await done.wait()
    fins_deferred = [d for d in deferred if d.startswith(b"FIN ")]
    fins_at_once = [d for d in at_once if d.startswith(b"FIN ")]
    assert not fins_deferred and len(fins_at_once) >= n
    rdys = [d for d in deferred + at_once if d.startswith(b"RDY ")]
    assert len(rdys) < 20, f"{len(rdys)} RDY commands for {n} messages"


async def test_unordered_partitioned_topic_consumes_everything(youzan_cluster, anyio_backend):
    topic = unique("part")
    create_topic(youzan_cluster, topic, partitions=2, replicas=1, channel="ch")
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        for i in range(20):
            await producer.publish_many(topic, [b"%d-%d" % (i, j) for j in range(100)])
    got: set[bytes] = set()
    partitions: set[int] = set()
    done = anyio.Event()

    async def handle(message: Message) -> None:
        got.add(message.body)
        assert message.partition is not None
        partitions.add(message.partition)
        if len(got) >= 2000:
            done.set()

    async with Consumer(
        topic, "ch", handle, lookupd_http_addresses=lookupds(youzan_cluster), max_in_flight=200
    ) as consumer:
        with anyio.fail_after(60):
            await done.wait()
        assert consumer.stats().connections == 2
    assert partitions == {0, 1}


async def test_sub_order_is_must_surfaces_or_adapts(youzan_cluster, anyio_backend, caplog):
    topic = unique("must")
    info = create_topic(youzan_cluster, topic, partitions=1, replicas=1, ordered=True, channel="ch")
    node = info["partitions"]["0"]
    address = f"{node['broadcast_address']}:{node['tcp_port']}"
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        await producer.publish(topic, b"ordered", partition=0)

    # Told explicitly "not ordered": the server's refusal is surfaced, clearly.
    caplog.set_level(logging.ERROR, logger="smartnsq.consumer")
    async with Consumer(
        topic, "ch", lambda m: None, nsqd_tcp_addresses=[address], ordered=False
    ) as c:
        await wait_until(lambda: c.last_error is not None, 10, "the subscription error")
        assert isinstance(c.last_error, SubOrderRequired)
        assert c.stats().connections == 0
    assert any("ordered=True" in r.getMessage() for r in caplog.records)

    # Left to the topic (the default): it switches to SUB_ORDERED by itself.
    got = anyio.Event()
    async with Consumer(topic, "ch", lambda m: got.set(), nsqd_tcp_addresses=[address]):
        with anyio.fail_after(15):
            await got.wait()


async def test_consume_trace_records_only_while_enabled(youzan_cluster, anyio_backend, caplog):
    topic = unique("trc")
    create_topic(youzan_cluster, topic, partitions=1, replicas=1, channel="ch")
    caplog.set_level(logging.INFO, logger="smartnsq.trace")
    received: list[Message] = []
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        first = await producer.publish(topic, b"one", trace_id=111)
        async with Consumer(
            topic, "ch", received.append, lookupd_http_addresses=lookupds(youzan_cluster)
        ) as consumer:
            await wait_until(lambda: len(received) == 1, 20, "first message")
            consumer.trace.enable(topic)
            await producer.publish(topic, b"two", trace_id=222)
            await wait_until(lambda: len(received) == 2, 20, "second message")
            consumer.trace.disable(topic)
            await producer.publish(topic, b"three")
            await wait_until(lambda: len(received) == 3, 20, "third message")
    assert first is not None and received[0].trace_id == 111
    records = [r for r in caplog.records if r.name == "smartnsq.trace"]
    assert len(records) == 1
    line = json.loads(JsonFormatter().format(records[0]))
    assert line["event"] == "consume"
    assert line["trace_id"] == 222 and line["topic"] == topic and line["channel"] == "ch"
    assert line["internal_id"] == received[1].internal_id
    assert line["partition"] == 0 and line["attempts"] == 1
    assert line["local"].startswith("127.0.0.1:") and line["nsqd"].startswith("127.0.0.1:")


async def test_leader_change_during_publish(cluster_factory, anyio_backend):
    """Stop the nsqd leading a replicated partition mid-publish: producers retry on the new
    leader and every publish reported successful reaches the consumer."""
    # Three replicas: after losing the leader the remaining two still form a write quorum
    # (with two replicas the fork keeps the partition read-only until a replica comes back).
    cluster = cluster_factory("youzan", nsqd=3)
    topic = unique("lead")
    info = create_topic(cluster, topic, partitions=1, replicas=3, channel="ch")
    leader_port = info["partitions"]["0"]["tcp_port"]
    leader = next(i for i, d in enumerate(cluster.nsqd) if d.tcp.endswith(f":{leader_port}"))
    ok: list[bytes] = []
    stopped = anyio.Event()
    async with Producer(
        lookupd_http_addresses=lookupds(cluster), timeout=60, max_retries=50, retry_backoff=0.2
    ) as producer:

        async def publisher() -> None:
            i = 0
            while not stopped.is_set() or i < 600:
                body = b"m%d" % i
                await producer.publish(topic, body)  # must not raise: retried until it lands
                ok.append(body)
                i += 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher)
            await wait_until(lambda: len(ok) >= 200, 30, "200 publishes before the stop")
            await anyio.to_thread.run_sync(lambda: cluster.kill_nsqd(leader, signal.SIGTERM))
            stopped.set()
    got: set[bytes] = set()
    done = anyio.Event()

    def handle(message: Message) -> None:
        got.add(message.body)
        if set(ok) <= got:
            done.set()

    async with Consumer(
        topic, "ch", handle, lookupd_http_addresses=lookupds(cluster), max_in_flight=100
    ):
        with anyio.fail_after(90):
            await done.wait()
    assert set(ok) <= got


async def test_lookupd_leader_killed_discovery_continues(cluster_factory, anyio_backend):
    cluster = cluster_factory("youzan", nsqd=2, lookupd=2)
    topic = unique("lkd")
    create_topic(cluster, topic, partitions=2, replicas=1, channel="ch")
    leader_http = cluster.lookupd_leader()
    leader = next(d for d in cluster.lookupd if d.http == leader_http)
    other = next(d for d in cluster.lookupd if d.http != leader_http)
    leader.signal(signal.SIGKILL)
    assert leader.wait_exit(10)
    got: set[bytes] = set()
    done = anyio.Event()
    # Seeds: the dead leader first. The live one must carry discovery and publishing.
    seeds = [leader.http, other.http]
    async with Producer(lookupd_http_addresses=seeds, timeout=30) as producer:
        for i in range(50):
            await producer.publish(topic, b"k%d" % i)

    def handle(message: Message) -> None:
        got.add(message.body)
        if len(got) >= 50:
            done.set()

    async with Consumer(topic, "ch", handle, lookupd_http_addresses=seeds, max_in_flight=50):
        with anyio.fail_after(60):
            await done.wait()


async def test_ext_topic_headers_reach_the_consumer(youzan_cluster, anyio_backend):
    """Through lookupd the consumer IDENTIFYs with extend_support from the topic's meta; in
    direct mode (no meta) it learns it from E_SUB_EXTEND_NEED and switches by itself."""
    topic = unique("ext")
    info = create_topic(youzan_cluster, topic, partitions=1, replicas=1, ext=True, channel="ch")
    node = info["partitions"]["0"]
    address = f"{node['broadcast_address']}:{node['tcp_port']}"
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        await producer.publish(topic, b"one", headers={"region": "eu", "n": 1})
        got: list[Message] = []
        async with Consumer(
            topic, "ch", got.append, lookupd_http_addresses=lookupds(youzan_cluster)
        ):
            await wait_until(lambda: len(got) == 1, 20, "the first message through lookupd")
        await producer.publish(topic, b"two", headers={"region": "us", "n": 2})
    more: list[Message] = []
    async with Consumer(topic, "ch", more.append, nsqd_tcp_addresses=[address]) as consumer:
        await wait_until(lambda: len(more) == 1, 20, "the second message in direct mode")
        assert consumer.last_error is None
    assert (got[0].body, got[0].headers) == (b"one", {"region": "eu", "n": 1})
    assert (more[0].body, more[0].headers) == (b"two", {"region": "us", "n": 2})


@pytest.mark.parametrize("ordered", [True, False])
async def test_an_async_handler_can_await_stop(youzan_cluster, anyio_backend, ordered):
    """An ordered message's handler starts in the read callback; awaiting consumer.stop()
    there ended in "Attempted to exit a cancel scope that isn't the current task's current
    cancel scope". It stops as on a classic topic: the message in hand answered, no error."""
    topic = unique("stopin")
    create_topic(youzan_cluster, topic, partitions=1, replicas=1, ordered=ordered, channel="ch")
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        for n in range(8):
            await producer.publish(topic, b"%d" % n, partition=0)

    handled: list[int] = []
    consumer: Consumer

    async def handle(message: Message) -> None:
        handled.append(int(message.body))
        if len(handled) == 4:
            await consumer.stop()

    consumer = Consumer(topic, "ch", handle, lookupd_http_addresses=lookupds(youzan_cluster))
    with anyio.fail_after(30):
        await consumer.run()  # returns once the stop is over, or raises
    assert handled == [0, 1, 2, 3]
    stats = consumer.stats()
    assert stats.finished + stats.requeued == stats.received


async def test_every_ordered_partition_is_ready_whatever_max_in_flight(
    youzan_cluster, anyio_backend
):
    """One message in flight per ordered partition whatever ``max_in_flight`` says: with
    the default (1) and four partitions, the partitions took turns holding RDY 1 (5 s each),
    so a message of a partition without it waited for its turn."""
    topic = unique("rdy1")
    create_topic(youzan_cluster, topic, partitions=4, replicas=1, ordered=True, channel="ch")
    handled: list[tuple[int | None, float]] = []

    async def handle(message: Message) -> None:
        handled.append((message.partition, time.monotonic()))

    async with Consumer(topic, "ch", handle, lookupd_http_addresses=lookupds(youzan_cluster)) as c:
        await wait_until(lambda: c.stats().connections == 4, 30, "4 partitions subscribed")
        await wait_until(
            lambda: all(n.rdy == 1 for n in c.stats().nodes.values()), 2, "RDY 1 on each"
        )
        async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
            sent = time.monotonic()
            for partition in range(4):
                await producer.publish(topic, b"m", partition=partition)
        await wait_until(lambda: len(handled) == 4, 10, "one message per partition handled")
    assert sorted(p for p, _ in handled) == [0, 1, 2, 3]
    assert max(t for _, t in handled) - sent < 2.0  # no partition waited for a turn
