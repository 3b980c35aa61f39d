"""Partition-aware Producer against the real Youzan HA cluster."""

from __future__ import annotations

import json
import logging
import random
import time
from collections import Counter

import anyio
import pytest

from compat.youzan import create_topic
from smartnsq import Consumer, Message, Producer
from smartnsq.errors import ExtNotSupported, InvalidArgument, NotSupported, TopicNotFound
from smartnsq.ordered import go_partition, java_partition
from smartnsq.protocol import MessageLayout, commands
from smartnsq.trace import JsonFormatter
from tests.helpers import drain, lookupds, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
]


@pytest.fixture(scope="module")
def topic2(youzan_cluster):
    topic = f"yzp_{random.getrandbits(32):x}"
    info = create_topic(youzan_cluster, topic, partitions=2, replicas=1, channel="ch")
    nodes = {
        int(p): f"{n['broadcast_address']}:{n['tcp_port']}" for p, n in info["partitions"].items()
    }
    return topic, nodes


async def test_round_robin_over_partitions_and_traced_results(
    youzan_cluster, topic2, anyio_backend
):
    topic, _ = topic2
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        results = [await producer.publish(topic, b"rr %d" % i, trace_id=i + 1) for i in range(10)]
    assert all(r is not None for r in results)
    partitions = Counter(r.partition for r in results if r)
    assert partitions == {0: 5, 1: 5}
    assert [r.trace_id for r in results if r] == list(range(1, 11))


async def test_sharding_key_maps_like_go_nsq(youzan_cluster, topic2, anyio_backend):
    topic, _ = topic2
    keys = [f"user-{i}" for i in range(40)]
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        for key in keys:
            result = await producer.publish(topic, key.encode(), sharding_key=key, trace_id=7)
            assert result is not None
            assert result.partition == go_partition(key, 2), key


async def test_java_sdk_and_custom_sharding(youzan_cluster, topic2, anyio_backend):
    topic, _ = topic2
    keys: list[str | int] = [f"order-{i}" for i in range(20)] + list(range(-10, 10))
    async with Producer(
        lookupd_http_addresses=lookupds(youzan_cluster), sharding="java"
    ) as producer:
        for key in keys:
            result = await producer.publish(topic, b"j", sharding_key=key, trace_id=8)
            assert result is not None
            assert result.partition == java_partition(key, 2), key
    # The two mappings really differ on these keys, so the test tells them apart.
    assert any(java_partition(k, 2) != go_partition(k, 2) for k in keys)

    calls: list[tuple[object, int]] = []

    def last_digit(key: object, partitions: int) -> int:
        calls.append((key, partitions))
        return int(str(key)[-1]) % partitions

    async with Producer(
        lookupd_http_addresses=lookupds(youzan_cluster), sharding=last_digit
    ) as producer:
        for i in range(10):
            result = await producer.publish(topic, b"c", sharding_key=f"k{i}", trace_id=9)
            assert result is not None
            assert result.partition == i % 2
    assert calls == [(f"k{i}", 2) for i in range(10)]


async def test_traced_ids_match_what_a_consumer_sees(youzan_cluster, anyio_backend):
    topic = f"yzt_{random.getrandbits(32):x}"
    info = create_topic(youzan_cluster, topic, partitions=1, replicas=1, channel="ch")
    address = (
        f"{info['partitions']['0']['broadcast_address']}:{info['partitions']['0']['tcp_port']}"
    )
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        sent = [await producer.publish(topic, b"t%d" % i, trace_id=1000 + i) for i in range(5)]
    got = await drain(
        address,
        topic,
        "ch",
        5,
        layout=MessageLayout(binary_id=True, offset=True),
        sub=commands.sub_ordered(topic, "ch", 0),
        distinct=True,
    )
    seen = {m.id: m for m in got}
    for result, body in zip(sent, [b"t%d" % i for i in range(5)], strict=True):
        assert result is not None
        msg = seen[result.message_id]
        assert msg.body == body
        assert (msg.internal_id, msg.trace_id, msg.offset) == (
            result.internal_id,
            result.trace_id,
            result.offset,
        )


async def test_trace_switch_and_records(youzan_cluster, topic2, anyio_backend, caplog):
    topic, _ = topic2
    caplog.set_level(logging.INFO, logger="smartnsq.trace")
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        assert await producer.publish(topic, b"untraced") is None
        assert not [r for r in caplog.records if r.name == "smartnsq.trace"]
        producer.trace.enable(topic)
        result = await producer.publish(topic, b"traced now")
        assert result is not None and result.trace_id != 0
        producer.trace.disable(topic)
        assert await producer.publish(topic, b"off again") is None
        producer.trace.enable()  # every topic
        many = await producer.publish_many(topic, [b"a", b"b"])
        assert many is not None and len(many) == 1
    records = [r for r in caplog.records if r.name == "smartnsq.trace"]
    assert len(records) == 2
    line = json.loads(JsonFormatter().format(records[0]))
    assert line["event"] == "publish"
    assert line["topic"] == topic
    assert line["internal_id"] == result.internal_id
    assert line["trace_id"] == result.trace_id
    assert line["offset"] == result.offset and line["size"] == result.size
    assert line["partition"] == result.partition
    assert line["nsqd"].count(":") == 1


async def test_fork_rejections_are_clear(youzan_cluster, topic2, anyio_backend):
    topic, _ = topic2
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster), max_retries=2) as producer:
        with pytest.raises(NotSupported, match="DPUB"):
            await producer.publish(topic, b"x", delay=1)
        with pytest.raises(ExtNotSupported):
            await producer.publish(topic, b"x", headers={"k": "v"})
        with pytest.raises(TopicNotFound):
            await producer.publish(f"missing_{random.getrandbits(24):x}", b"x")
        await producer.publish(topic, b"still fine afterwards")


async def test_ext_topic_headers(youzan_cluster, anyio_backend):
    topic = f"yze_{random.getrandbits(32):x}"
    create_topic(youzan_cluster, topic, partitions=1, replicas=1, ext=True, channel="ch")
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        assert await producer.publish(topic, b"with header", headers={"k": "v"}) is None
        traced = await producer.publish(topic, b"traced header", headers={"k": "w"}, trace_id=99)
    assert traced is not None and traced.trace_id == 99


async def test_concurrent_sharded_publish(youzan_cluster, anyio_backend):
    """Eight tasks publish at once, each with its own sharding key: every message lands on the
    partition its key maps to, stored in its task's order, and is consumed once."""
    topic = f"yzs_{random.getrandbits(32):x}"
    create_topic(youzan_cluster, topic, partitions=2, replicas=1, channel="ch")
    workers, each = 8, 25
    keys = [f"k{w}" for w in range(workers)]
    assert {go_partition(k, 2) for k in keys} == {0, 1}  # both partitions are published to
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:

        async def worker(w: int) -> None:
            for i in range(each):
                await producer.publish(topic, b"%d-%d" % (w, i), sharding_key=keys[w])

        async with anyio.create_task_group() as tg:
            for w in range(workers):
                tg.start_soon(worker, w)

    got: list[tuple[int | None, int | None, bytes]] = []

    def handle(message: Message) -> None:
        got.append((message.partition, message.offset, message.body))

    async with Consumer(
        topic,
        "ch",
        handle,
        lookupd_http_addresses=lookupds(youzan_cluster),
        max_in_flight=50,
        advanced=True,  # each message says where its partition stored it
    ) as consumer:
        await wait_until(lambda: len(got) >= workers * each, timeout=30, what="every message")
        await consumer.stop()
    bodies = Counter(body for _, _, body in got)
    assert sorted(bodies) == sorted(b"%d-%d" % (w, i) for w in range(workers) for i in range(each))
    assert set(bodies.values()) == {1}  # none twice
    assert consumer.stats().finished == workers * each
    assert None not in {offset for _, offset, _ in got}
    order: dict[int, list[int]] = {}
    for partition, _, body in sorted(got, key=lambda m: (m[0] or 0, m[1] or 0)):
        w, i = map(int, body.split(b"-"))
        assert partition == go_partition(keys[w], 2), body
        order.setdefault(w, []).append(i)
    assert order == {w: list(range(each)) for w in range(workers)}


async def test_a_missing_topic_fails_at_once(youzan_cluster, anyio_backend):
    # The fork's operator creates topics: unlike classic nsqd, no publish creates one, so a
    # missing topic is no outage to wait out.
    missing = f"missing_{random.getrandbits(24):x}"
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster), timeout=10) as producer:
        started = anyio.current_time()
        with pytest.raises(TopicNotFound, match="create it first"):
            await producer.publish(missing, b"x")
        assert anyio.current_time() - started < 2


def test_a_missing_topic_fails_at_once_blocking(youzan_cluster, anyio_backend):
    from smartnsq import sync as nsq_sync

    missing = f"missing_{random.getrandbits(24):x}"
    with nsq_sync.Producer(lookupd_http_addresses=lookupds(youzan_cluster), timeout=10) as producer:
        started = time.monotonic()
        with pytest.raises(TopicNotFound, match="create it first"):
            producer.publish_many(missing, [b"x"])
        assert time.monotonic() - started < 2


@pytest.mark.parametrize("key", [b"\xff\xfe", 2**64, -(2**63) - 1])
async def test_java_sharding_refuses_keys_java_cannot_hash(
    youzan_cluster, topic2, anyio_backend, key
):
    # Before: a bare UnicodeDecodeError, or 2**64 silently on the partition of 0.
    topic, _ = topic2
    async with Producer(
        lookupd_http_addresses=lookupds(youzan_cluster), sharding="java"
    ) as producer:
        with pytest.raises(InvalidArgument):
            await producer.publish(topic, b"k", sharding_key=key, trace_id=5)
        assert producer.stats().published == 0
        # The go mapping takes the same key, and the partition it names stores it.
        async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as go:
            result = await go.publish(topic, b"k", sharding_key=key, trace_id=6)
        assert result is not None and result.partition == go_partition(key, 2)
