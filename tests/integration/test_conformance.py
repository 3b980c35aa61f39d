"""Drop-in check: the same producer/consumer scenarios against every server kind.

A user points smartnsq at lookupds and nothing else; classic nsqlookupd and the Youzan HA
cluster must both just work.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator

import anyio
import pytest

from compat.cluster import Cluster
from compat.pytest_plugin import require_youzan_binaries
from compat.youzan import create_topic
from smartnsq import Consumer, Message, Producer
from tests.helpers import UVLOOP, create_channel, lookupds, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio", UVLOOP]),
]


@pytest.fixture(scope="module", params=["classic", "youzan"])
def cluster(request, tmp_path_factory) -> Iterator[Cluster]:
    kind = request.param
    if kind == "youzan":
        require_youzan_binaries()
    c = Cluster.start(kind=kind, dir=tmp_path_factory.mktemp(f"conf-{kind}"), nsqd=2)
    try:
        yield c
    finally:
        c.stop()


def new_topic(cluster: Cluster, prefix: str) -> str:
    topic = f"{prefix}_{random.getrandbits(32):x}"
    if cluster.kind == "youzan":
        create_topic(cluster, topic, partitions=2, replicas=1, channel="ch")
    else:
        for nsqd in cluster.nsqd:
            create_channel(nsqd.http, topic, "ch")
    return topic


async def test_publish_and_consume_exactly_once(cluster, anyio_backend):
    topic = new_topic(cluster, "once")
    bodies = [b"m%d" % i for i in range(1000)]
    async with Producer(lookupd_http_addresses=lookupds(cluster)) as producer:
        for b in bodies[:100]:
            await producer.publish(topic, b)
        await producer.publish_many(topic, bodies[100:])
    seen: Counter[bytes] = Counter()

    async def handle(message: Message) -> None:
        seen[message.body] += 1

    async with Consumer(
        topic, "ch", handle, lookupd_http_addresses=lookupds(cluster), max_in_flight=100
    ) as consumer:
        await wait_until(lambda: sum(seen.values()) >= len(bodies), 30)
        assert consumer.stats().connections == 2
    assert set(seen) == set(bodies) and max(seen.values()) == 1


async def test_concurrent_publishers(cluster, anyio_backend):
    topic = new_topic(cluster, "conc")
    async with Producer(lookupd_http_addresses=lookupds(cluster)) as producer:

        async def worker(w: int) -> None:
            for i in range(50):
                await producer.publish(topic, b"%d-%d" % (w, i))

        async with anyio.create_task_group() as tg:
            for w in range(8):
                tg.start_soon(worker, w)
    got: set[bytes] = set()
    async with Consumer(
        topic,
        "ch",
        lambda m: got.add(m.body),
        lookupd_http_addresses=lookupds(cluster),
        max_in_flight=50,
    ):
        await wait_until(lambda: len(got) >= 400, 30)


async def test_requeue_redelivers_with_more_attempts(cluster, anyio_backend):
    topic = new_topic(cluster, "req")
    async with Producer(lookupd_http_addresses=lookupds(cluster)) as producer:
        await producer.publish(topic, b"flaky")
    attempts: list[int] = []

    def handle(message: Message) -> None:
        attempts.append(message.attempts)
        if message.attempts == 1:
            raise RuntimeError("first try fails")

    async with Consumer(
        topic,
        "ch",
        handle,
        lookupd_http_addresses=lookupds(cluster),
        requeue_delay=0,
        backoff=False,
    ) as consumer:
        await wait_until(lambda: consumer.stats().finished == 1, 30)
    assert attempts == [1, 2]


async def test_giving_up_after_max_attempts(cluster, anyio_backend):
    topic = new_topic(cluster, "giveup")
    async with Producer(lookupd_http_addresses=lookupds(cluster)) as producer:
        await producer.publish(topic, b"poison")
    gave_up: list[int] = []

    def handle(message: Message) -> None:
        raise RuntimeError("always fails")

    async with Consumer(
        topic,
        "ch",
        handle,
        lookupd_http_addresses=lookupds(cluster),
        requeue_delay=0,
        backoff=False,
        max_attempts=2,
        on_giving_up=lambda m: gave_up.append(m.attempts),
    ) as consumer:
        await wait_until(lambda: gave_up, 30)
        await wait_until(lambda: consumer.stats().in_flight == 0, 30)
    assert gave_up == [3]


async def test_manual_answers_and_touch(cluster, anyio_backend):
    topic = new_topic(cluster, "manual")
    async with Producer(lookupd_http_addresses=lookupds(cluster)) as producer:
        await producer.publish(topic, b"hold me")
    held: list[Message] = []

    def handle(message: Message) -> None:
        message.disable_auto_response()
        held.append(message)

    async with Consumer(topic, "ch", handle, lookupd_http_addresses=lookupds(cluster)) as consumer:
        await wait_until(lambda: held, 30)
        assert consumer.stats().in_flight == 1
        held[0].touch()
        held[0].finish()
        await wait_until(lambda: consumer.stats().in_flight == 0, 30)
        assert consumer.stats().finished == 1


async def test_pull_mode(cluster, anyio_backend):
    topic = new_topic(cluster, "pull")
    async with Producer(lookupd_http_addresses=lookupds(cluster)) as producer:
        await producer.publish_many(topic, [b"p%d" % i for i in range(20)])
    got: set[bytes] = set()
    async with Consumer(
        topic, "ch", lookupd_http_addresses=lookupds(cluster), max_in_flight=10
    ) as consumer:
        with anyio.fail_after(30):
            async for message in consumer:
                got.add(message.body)
                if len(got) == 20:
                    break
    assert len(got) == 20


async def test_graceful_stop_loses_nothing(cluster, anyio_backend):
    topic = new_topic(cluster, "stop")
    bodies = {b"s%d" % i for i in range(200)}
    async with Producer(lookupd_http_addresses=lookupds(cluster)) as producer:
        await producer.publish_many(topic, sorted(bodies))
    first: set[bytes] = set()

    async def slow(message: Message) -> None:
        await anyio.sleep(0.05)
        first.add(message.body)

    async with Consumer(
        topic, "ch", slow, lookupd_http_addresses=lookupds(cluster), max_in_flight=20
    ):
        await wait_until(lambda: len(first) >= 40, 30)
    second: set[bytes] = set()
    async with Consumer(
        topic,
        "ch",
        lambda m: second.add(m.body),
        lookupd_http_addresses=lookupds(cluster),
        max_in_flight=50,
    ):
        await wait_until(lambda: first | second >= bodies, 30)
    assert not first & second
