"""Partitions that change under running producers and consumers, on the real Youzan cluster:
a topic expanded to more partitions, a partition whose leader moves to another nsqd."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.to_thread
import pytest

import smartnsq.sync
from compat.youzan import create_topic, expand_topic, move_leader
from smartnsq import Consumer, Message, Producer
from smartnsq.ordered.sharding import go_partition
from tests.helpers import lookupds, unique, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
]

KEYS = [f"key-{k}" for k in range(40)]
STREAMS = ("async", "async-keyed", "sync", "sync-keyed")


class Traffic:
    """Four publishers (async and blocking producer, each unkeyed and keyed) that publish
    until stopped; every acknowledged body is recorded per stream, failures too."""

    def __init__(self, topic: str, lookupd: list[str], **options: Any) -> None:
        self.topic = topic
        self.lookupd = lookupd
        self.options = options
        self.ok: dict[str, list[bytes]] = {s: [] for s in STREAMS}
        self.failed: list[tuple[str, BaseException]] = []
        self.stop = threading.Event()

    @staticmethod
    def body(stream: str, i: int) -> tuple[bytes, str | None]:
        key = KEYS[i % len(KEYS)] if stream.endswith("keyed") else None
        return f"{stream}:{i}:{key or ''}".encode(), key

    async def run_async(self) -> None:
        async with Producer(lookupd_http_addresses=self.lookupd, **self.options) as producer:

            async def publish(stream: str) -> None:
                i = 0
                while not self.stop.is_set():
                    body, key = self.body(stream, i)
                    try:
                        await producer.publish(self.topic, body, sharding_key=key)
                    except Exception as exc:  # recorded: the test says which and why
                        self.failed.append((stream, exc))
                    else:
                        self.ok[stream].append(body)
                    i += 1

            async with anyio.create_task_group() as tg:
                tg.start_soon(publish, "async")
                tg.start_soon(publish, "async-keyed")

    def run_sync(self) -> None:
        with smartnsq.sync.Producer(lookupd_http_addresses=self.lookupd, **self.options) as p:
            i = 0
            while not self.stop.is_set():
                for stream in ("sync", "sync-keyed"):
                    body, key = self.body(stream, i)
                    try:
                        p.publish(self.topic, body, sharding_key=key)
                    except Exception as exc:
                        self.failed.append((stream, exc))
                    else:
                        self.ok[stream].append(body)
                i += 1

    def acknowledged(self) -> set[bytes]:
        return {b for bodies in self.ok.values() for b in bodies}


class Received:
    """What one channel's consumer got: deliveries per body and the partition of each."""

    def __init__(self) -> None:
        self.count: Counter[bytes] = Counter()
        self.partition: dict[bytes, int | None] = {}
        self.by_partition: dict[int | None, set[str]] = defaultdict(set)

    async def handle(self, message: Message) -> None:
        body = message.body
        self.count[body] += 1
        self.partition[body] = message.partition
        self.by_partition[message.partition].add(body.split(b":", 1)[0].decode())

    def redeliveries(self) -> int:
        return sum(n - 1 for n in self.count.values())

    def assert_keyed(self, bodies: list[bytes], partitions: int) -> None:
        """Each keyed body (``stream:seq:key``) went to go-nsq's partition for its key."""
        for body in bodies:
            key = body.rsplit(b":", 1)[1]
            assert self.partition[body] == go_partition(key, partitions), body


async def every_stream_on_partition_0(
    received: Received, traffic: Traffic, after: dict[str, int], timeout: float, what: str
) -> None:
    """Wait until each stream has a message acknowledged after ``after`` on partition 0."""
    await wait_until(
        lambda: all(
            any(received.partition.get(b) == 0 for b in traffic.ok[s][after[s] :]) for s in STREAMS
        ),
        timeout,
        what,
    )


def check_leader_change(what: str, received: Received, traffic: Traffic, sent: set[bytes]) -> None:
    """Nothing acknowledged is missing and keys kept their partition (of 2)."""
    # A publish that raised was not acknowledged; whether nsqd stored it is unknown, so it
    # may or may not arrive. Redeliveries after a leader change are allowed (at least once).
    assert set(received.count) >= sent
    print(
        f"{what}: {len(sent)} acknowledged, {len(traffic.failed)} raised, "
        f"{received.redeliveries()} redeliveries"
    )
    for stream in ("async-keyed", "sync-keyed"):
        received.assert_keyed(traffic.ok[stream], 2)


async def _run_in_thread(fn: Callable[[], None]) -> None:
    await anyio.to_thread.run_sync(fn)


@contextlib.asynccontextmanager
async def running(
    topic: str, traffic: Traffic, received: Received, settle: float, **options: Any
) -> AsyncIterator[Consumer]:
    """A consumer of channel "a" on both partitions and the four publishers under way (100
    acknowledged each) for the body; then the publishers stop and every acknowledged
    message must arrive within ``settle`` seconds."""
    async with Consumer(
        topic, "a", received.handle, lookupd_http_addresses=traffic.lookupd, **options
    ) as consumer:
        await wait_until(lambda: consumer.stats().connections == 2, 30, "both partitions")
        async with anyio.create_task_group() as tg:
            tg.start_soon(traffic.run_async)
            tg.start_soon(_run_in_thread, traffic.run_sync)
            try:
                await wait_until(lambda: all(len(v) >= 100 for v in traffic.ok.values()), 60)
                yield consumer
            finally:  # the blocking publisher's thread cannot be cancelled
                traffic.stop.set()
        sent = traffic.acknowledged()
        await wait_until(lambda: set(received.count) >= sent, settle, "every acknowledged message")


async def test_expanded_topic_is_followed_without_restarts(youzan_cluster, anyio_backend):
    """2 partitions become 3 while four publishers and a consumer run: round robin and keys
    use the new partition count after the next lookup, the consumer subscribes to the new
    partition (its SUB creates the channel there, which makes the partition writable), and
    it gets every acknowledged message exactly once."""
    topic = unique("exp")
    create_topic(youzan_cluster, topic, partitions=2, replicas=1, multipart=True, channel="a")
    lookupd = lookupds(youzan_cluster)
    received = Received()
    traffic = Traffic(topic, lookupd, lookupd_poll_interval=0.5, timeout=30, max_retries=12)
    async with running(
        topic, traffic, received, 60, lookupd_poll_interval=0.5, max_in_flight=50
    ) as consumer:
        before = {s: len(v) for s, v in traffic.ok.items()}
        await anyio.to_thread.run_sync(lambda: expand_topic(youzan_cluster, topic, 3))
        await wait_until(
            lambda: received.by_partition[2] >= set(STREAMS), 60, "every stream on partition 2"
        )
        late = {s: len(v) for s, v in traffic.ok.items()}
        await wait_until(
            lambda: all(len(traffic.ok[s]) >= late[s] + 100 for s in STREAMS),
            60,
            "more traffic after the expansion",
        )
        assert consumer.stats().connections == 3
    sent = traffic.acknowledged()

    assert not traffic.failed, traffic.failed[:5]
    redelivered = {b: n for b, n in received.count.items() if n > 1}
    assert not redelivered, f"{received.redeliveries()} redeliveries: {list(redelivered)[:5]}"
    assert set(received.count) == sent
    for stream in ("async-keyed", "sync-keyed"):
        bodies = traffic.ok[stream]
        received.assert_keyed(bodies[: before[stream]], 2)  # before the expansion
        received.assert_keyed(bodies[late[stream] :], 3)  # after the new layout was seen
    for stream in ("async", "sync"):  # round robin over all three
        tail = traffic.ok[stream][late[stream] :]
        assert {received.partition[b] for b in tail} == {0, 1, 2}, stream


async def test_moved_leader_is_followed_by_producers_and_consumer(cluster_factory, anyio_backend):
    """The nsqd leading partition 0 (of 2, three replicas each) stops while four publishers
    and a consumer run: publishes keep succeeding (or raise: then nothing was acknowledged),
    the consumer follows the new leader, and every acknowledged message arrives."""
    cluster = cluster_factory("youzan", nsqd=3)
    topic = unique("move")
    info = create_topic(
        cluster, topic, partitions=2, replicas=3, multipart=True, channel="a", timeout=90
    )
    port = info["partitions"]["0"]["tcp_port"]
    leader = next(i for i, d in enumerate(cluster.nsqd) if d.tcp.endswith(f":{port}"))
    lookupd = lookupds(cluster)
    received = Received()
    traffic = Traffic(
        topic, lookupd, lookupd_poll_interval=0.5, timeout=60, max_retries=30, retry_backoff=0.1
    )
    async with running(topic, traffic, received, 90, lookupd_poll_interval=0.5, max_in_flight=50):
        await anyio.to_thread.run_sync(lambda: cluster.kill_nsqd(leader, signal.SIGTERM))
        after = {s: len(v) for s, v in traffic.ok.items()}
        # Partition 0 goes on, on another nsqd: new messages of every stream arrive.
        await every_stream_on_partition_0(
            received, traffic, after, 90, "every stream on partition 0 after its leader stopped"
        )
        await anyio.to_thread.run_sync(lambda: cluster.restart_nsqd(leader))
        again = {s: len(v) for s, v in traffic.ok.items()}
        await wait_until(
            lambda: all(len(traffic.ok[s]) >= again[s] + 100 for s in STREAMS),
            60,
            "more traffic after the restart",
        )
    sent = traffic.acknowledged()

    check_leader_change("leader change", received, traffic, sent)


async def test_leader_moved_by_the_admin_is_followed_without_waiting_for_a_poll(
    youzan_cluster, anyio_backend
):
    """The lookupd moves partition 0's leader to the other nsqd (both stay up) while four
    publishers and a consumer run with the default 60 s lookup poll: both follow it at once
    (the old leader closes the consumer's connection and refuses publishes), nothing
    acknowledged is lost and keys keep their partition."""
    topic = unique("admv")
    info = create_topic(
        youzan_cluster, topic, partitions=2, replicas=2, multipart=True, channel="a"
    )
    port = info["partitions"]["0"]["tcp_port"]
    other = next(i for i, d in enumerate(youzan_cluster.nsqd) if not d.tcp.endswith(f":{port}"))
    lookupd = lookupds(youzan_cluster)
    received = Received()
    traffic = Traffic(topic, lookupd, timeout=30, max_retries=12)
    async with running(topic, traffic, received, 60):
        await anyio.to_thread.run_sync(lambda: move_leader(youzan_cluster, topic, 0, other))
        after = {s: len(v) for s, v in traffic.ok.items()}
        # Well within the 60 s poll: only the move itself can have told them.
        await every_stream_on_partition_0(
            received, traffic, after, 30, "every stream on partition 0 after the move"
        )
    sent = traffic.acknowledged()

    check_leader_change("admin move", received, traffic, sent)
