"""Youzan HA under network faults: keyed publishes and an ordered consumer.

Three nsqd and two nsqlookupd, every client-facing port behind a proxy (the daemons
listen on 127.0.0.2 and register 127.0.0.1, where the proxies are; replication and etcd are
direct). An ordered topic with two partitions, two replicas each. Eight tasks publish with
sharding keys (each key is published by one task, numbered in order) while an ordered
consumer handles. Cases:

(a) the link between the clients and one partition's leader goes silent (both directions,
    sockets open) for longer than the publish timeout, then heals;
(b) with 300 ms (+- 50 ms) latency on every nsqd link, one partition's leader nsqd is
    stopped (SIGKILL) and a replica takes over;
(c) one of the two lookupds (the leader) goes silent.

Per case, asserted: acknowledged lost == 0 and per-key order violations == 0 in what the
ordered consumer handled. Printed (and asserted to stay under a generous bound): duplicates
and the time until every key is acknowledged again.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable

import anyio
import pytest

from compat.toxiproxy import ProxiedYouzan
from compat.youzan import create_topic, lookup, restore_writable
from smartnsq import Consumer, Message, Producer
from smartnsq.errors import NSQError
from tests.helpers import unique

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.anyio]

PUBLISHERS = 8
KEYS_PER_TASK = 4
PUBLISH_TIMEOUT = 2.0
HEARTBEAT = 1.0
POLL = 1.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Book:
    """Acknowledged, raised and handled, per key."""

    def __init__(self) -> None:
        self.acked: dict[tuple[str, int], float] = {}
        self.last_ack: dict[str, list[float]] = defaultdict(list)
        self.errors: list[BaseException] = []
        self.handled: list[tuple[str, int, int | None]] = []  # (key, seq, partition)
        self.seen: dict[tuple[str, int], int] = defaultdict(int)

    def handle(self, message: Message) -> None:
        key, seq = message.body.decode().split("|")
        self.handled.append((key, int(seq), message.partition))
        self.seen[(key, int(seq))] += 1

    def lost(self) -> list[tuple[str, int]]:
        return sorted(k for k in self.acked if k not in self.seen)

    def duplicates(self) -> int:
        return sum(n - 1 for n in self.seen.values() if n > 1)

    def order_violations(self) -> list[tuple[str, int, int]]:
        """(key, seq, highest before) for each message handled after a later one of its
        key; handling the latest one again is a duplicate, not a violation."""
        highest: dict[str, int] = {}
        out = []
        for key, seq, _ in self.handled:
            top = highest.get(key, -1)
            if seq < top:
                out.append((key, seq, top))
            highest[key] = max(top, seq)
        return out

    def recovered_after(self, t: float) -> float:
        """Seconds from ``t`` until every key had an acknowledged publish again."""
        firsts = []
        for times in self.last_ack.values():
            after = [x for x in times if x >= t]
            firsts.append(after[0] - t if after else math.inf)
        return max(firsts)


async def run_case(
    cluster: ProxiedYouzan,
    fault: Callable[[str], float],
    heal: Callable[[], object],
    hold: float,
    topics: list[str] | None = None,
    marks: list[float] | None = None,
) -> dict[str, object]:
    """Publish and consume; ``fault(leader_tcp)`` returns the time it struck, ``heal()`` the
    time recovery is measured from (anything else: from the strike)."""
    topic = unique("ha")
    if topics is not None:
        topics.append(topic)
    await anyio.to_thread.run_sync(
        lambda: create_topic(cluster.cluster, topic, partitions=2, replicas=2, ordered=True)
    )
    lookupds = [cluster.public(d.http) for d in cluster.cluster.lookupd]
    book = Book()
    publishing = True

    async def publisher(producer: Producer, task: int) -> None:
        seqs = [0] * KEYS_PER_TASK
        i = 0
        while publishing:
            k = i % KEYS_PER_TASK
            key = f"k{task}-{k}"
            seq = seqs[k]
            i += 1
            try:
                await producer.publish(topic, f"{key}|{seq}".encode(), sharding_key=key)
            except Exception as exc:
                book.errors.append(exc)
                if not isinstance(exc, NSQError):
                    raise
                await anyio.sleep(0.05)
                continue  # the same seq again: an unknown outcome may leave a duplicate
            book.acked[(key, seq)] = time.monotonic()
            book.last_ack[key].append(time.monotonic())
            seqs[k] += 1
            await anyio.sleep(0.02)

    async def handle(message: Message) -> None:
        book.handle(message)

    common = {"heartbeat_interval": HEARTBEAT, "lookupd_poll_interval": POLL}
    async with (
        Producer(
            lookupd_http_addresses=lookupds, timeout=PUBLISH_TIMEOUT, max_retries=3, **common
        ) as producer,
        Consumer(
            topic,
            "ch",
            handle,
            lookupd_http_addresses=lookupds,
            reconnect_min=0.2,
            reconnect_max=2.0,
            msg_timeout=5.0,
            **common,
        ),
    ):
        async with anyio.create_task_group() as tg:
            for task in range(PUBLISHERS):
                tg.start_soon(publisher, producer, task)
            with anyio.fail_after(60):  # warm: both partitions delivering
                while len({p for _, _, p in book.handled}) < 2 or len(book.handled) < 20:
                    await anyio.sleep(0.05)
            info = await anyio.to_thread.run_sync(lambda: lookup(lookupds[0], topic, "w"))
            leader = info["partitions"]["0"]
            leader_tcp = f"{leader['broadcast_address']}:{leader['tcp_port']}"
            struck = await anyio.to_thread.run_sync(fault, leader_tcp)
            await anyio.sleep(hold)
            healed = await anyio.to_thread.run_sync(heal)
            since = healed if isinstance(healed, float) else struck
            with anyio.fail_after(60):  # every key acknowledged again
                while book.recovered_after(since) == math.inf:
                    await anyio.sleep(0.05)
            await anyio.sleep(1.0)
            publishing = False
        await anyio.to_thread.run_sync(cluster.heal)  # drain without toxics
        with anyio.fail_after(60):
            while book.lost():
                await anyio.sleep(0.1)

    foreign = [e for e in book.errors if not isinstance(e, NSQError)]
    result: dict[str, object] = {
        "acked": len(book.acked),
        "handled": len(book.handled),
        "lost": len(book.lost()),
        "order_violations": len(book.order_violations()),
        "duplicates": book.duplicates(),
        "recovered_s": round(book.recovered_after(since), 2),
        **(
            {"recovered_after_writable_s": round(book.recovered_after(marks[-1]), 2)}
            if marks
            else {}
        ),
        "errors": len(book.errors),
        "error_kinds": sorted({type(e).__name__ for e in book.errors}),
    }
    print(f"\n{result}")
    assert not foreign, foreign[:3]
    assert book.lost() == [], result
    assert book.order_violations() == [], (book.order_violations()[:10], result)
    return result


async def test_a_leader_link_silent_longer_than_the_publish_timeout(proxied_youzan):
    cluster = await anyio.to_thread.run_sync(proxied_youzan)

    def silence(leader_tcp: str) -> float:
        for proxy in cluster.nsqd(cluster.nsqd_index(leader_tcp)):
            proxy.silence()
        return time.monotonic()

    def heal() -> float:
        cluster.heal()
        return time.monotonic()

    result = await run_case(cluster, silence, heal, hold=PUBLISH_TIMEOUT * 2)
    # back within: a stale connection given up (2.2 heartbeats), a failed node's back-off
    # (which doubles while it fails, so at most about twice the outage), a publish timeout
    assert result["recovered_s"] <= 2.2 * HEARTBEAT + 2 * (2 * PUBLISH_TIMEOUT) + 10


@pytest.mark.slow  # about a minute: the fork takes ~20 s to name the replica leader
async def test_a_leader_stopped_a_replica_takes_over_with_latency(proxied_youzan):
    cluster = await anyio.to_thread.run_sync(proxied_youzan)
    for i in range(len(cluster.cluster.nsqd)):
        for proxy in cluster.nsqd(i):
            proxy.latency(300, 50, streams=("downstream",))

    topic: list[str] = []

    def stop_leader(leader_tcp: str) -> float:
        struck = time.monotonic()
        cluster.cluster.kill_nsqd(cluster.nsqd_index(leader_tcp))
        return struck

    def take_over() -> None:
        # the fork needs the channel on the new leader and a topic check (see restore_writable)
        restore_writable(cluster.cluster, topic[0])
        writable.append(time.monotonic())

    writable: list[float] = []
    result = await run_case(cluster, stop_leader, take_over, hold=0.0, topics=topic, marks=writable)
    print(f"leader stopped, replica took over: {result}")


async def test_one_of_two_lookupds_silent(proxied_youzan):
    cluster = await anyio.to_thread.run_sync(proxied_youzan)
    leader = cluster.cluster.lookupd_leader()
    index = next(
        i for i, d in enumerate(cluster.cluster.lookupd) if cluster.public(d.http) == leader
    )

    def silence(leader_tcp: str) -> float:
        for proxy in cluster.lookupd(index):
            proxy.silence()
        return time.monotonic()

    result = await run_case(cluster, silence, lambda: None, hold=POLL * 5)
    # publishing never depends on one lookupd: every key keeps being acknowledged
    assert result["recovered_s"] <= POLL * 5


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["reset", "slicer"])
async def test_a_leader_link_reset_or_sliced(proxied_youzan, fault):
    """The leader's client link resets every connection, or cuts every write into 1-7 byte
    pieces, for twice the publish timeout: the same guarantees as a silent link."""
    cluster = await anyio.to_thread.run_sync(proxied_youzan)

    def strike(leader_tcp: str) -> float:
        for proxy in cluster.nsqd(cluster.nsqd_index(leader_tcp)):
            proxy.reset_peer() if fault == "reset" else proxy.slicer(4, 3)
        return time.monotonic()

    def heal() -> float:
        cluster.heal()
        return time.monotonic()

    result = await run_case(cluster, strike, heal, hold=PUBLISH_TIMEOUT * 2)
    assert result["recovered_s"] <= 2.2 * HEARTBEAT + 2 * (2 * PUBLISH_TIMEOUT) + 10
