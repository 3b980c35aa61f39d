"""Channel lag against real nsqd: classic (depth + in flight + deferred) and Youzan (per
partition, end minus the channel's consumed count)."""

from __future__ import annotations

import anyio
import pytest

from compat.youzan import create_topic
from smartnsq import Consumer, Message, Producer
from smartnsq.errors import InvalidArgument, NsqdHttpFailed
from smartnsq.lag import ChannelLag, channel_lag, classic_lag
from tests.helpers import (
    create_channel,
    lookupds,
    unique,
    unused_address,
    wait_for,
    wait_until,
)

asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])


@pytest.mark.anyio
async def test_arguments_are_checked_before_anything_is_asked() -> None:
    with pytest.raises(InvalidArgument, match="lookupd_http_addresses or nsqd_http_addresses"):
        await channel_lag("t", "c")
    with pytest.raises(InvalidArgument):
        await channel_lag("bad topic", "c", nsqd_http_addresses=["127.0.0.1:1"])
    with pytest.raises(InvalidArgument):
        await channel_lag("t", "c", nsqd_http_addresses=["127.0.0.1:1"], timeout=0)


def test_classic_lag_adds_depth_in_flight_and_deferred() -> None:
    stats = {
        "topics": [
            {"topic_name": "other", "channels": [{"channel_name": "c", "depth": 99}]},
            {
                "topic_name": "t",
                "channels": [
                    {"channel_name": "x", "depth": 50},
                    {"channel_name": "c", "depth": 3, "in_flight_count": 2, "deferred_count": 1},
                ],
            },
        ]
    }
    assert classic_lag(stats, "t", "c") == 6
    assert classic_lag(stats, "t", "missing") is None
    assert classic_lag({"topics": []}, "t", "c") is None
    with pytest.raises(ValueError):
        classic_lag({"nope": 1}, "t", "c")
    with pytest.raises(ValueError):
        classic_lag({"topics": [{"topic_name": "t", "channels": [
            {"channel_name": "c", "depth": -1}]}]}, "t", "c")  # fmt: skip


@pytest.mark.integration
@pytest.mark.anyio
@asyncio_only
async def test_classic_lag_through_lookupd_and_direct(classic_cluster) -> None:
    topic, channel = unique("lag"), "c"
    nsqd = classic_cluster.nsqd[0]
    create_channel(nsqd.http, topic, channel)
    async with Producer(nsqd_tcp_addresses=[nsqd.tcp]) as producer:
        await producer.publish_many(topic, [b"m%d" % i for i in range(7)])

    assert await channel_lag(topic, channel, lookupd_http_addresses=lookupds(classic_cluster)) == [
        ChannelLag(topic, channel, nsqd.http, None, 7)
    ]

    # One at a time: three finished, the fourth held in flight (it still counts).
    received: list[Message] = []
    holding = anyio.Event()

    async def handle(message: Message) -> None:
        received.append(message)
        if len(received) == 4:
            message.disable_auto_response()
            holding.set()

    async with Consumer(topic, channel, handle, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=1):
        with anyio.fail_after(10):
            await holding.wait()
        result = await channel_lag(topic, channel, nsqd_http_addresses=[nsqd.http])
        assert [r.messages for r in result] == [4]  # 3 waiting + 1 in flight
        received[-1].finish()

    # Closing the connection puts the held message back: still 3 to go, whenever nsqd shows it.
    with anyio.fail_after(10):
        while True:
            lag = await channel_lag(topic, channel, nsqd_http_addresses=[nsqd.http])
            if [r.messages for r in lag] == [3]:
                break
            await anyio.sleep(0.05)


@pytest.mark.integration
@pytest.mark.anyio
@asyncio_only
async def test_one_unreachable_nsqd_does_not_hide_the_others(classic_cluster) -> None:
    topic, channel = unique("lag"), "c"
    nsqd = classic_cluster.nsqd[0]
    create_channel(nsqd.http, topic, channel)
    dead = unused_address()
    result = await channel_lag(topic, channel, nsqd_http_addresses=[nsqd.http, dead])
    by_node = {r.nsqd: r for r in result}
    assert by_node[nsqd.http].messages == 0
    assert by_node[dead].messages is None and by_node[dead].error
    with pytest.raises(NsqdHttpFailed, match="no nsqd told the lag"):
        await channel_lag(topic, channel, nsqd_http_addresses=[dead])


@pytest.mark.integration
@pytest.mark.anyio
@asyncio_only
async def test_a_channel_that_does_not_exist_has_no_lag_figure(classic_cluster) -> None:
    nsqd = classic_cluster.nsqd[0]
    result = await channel_lag(unique("lag"), "c", nsqd_http_addresses=[nsqd.http])
    assert [r.messages for r in result] == [None]
    assert result[0].error is None


@pytest.mark.integration
@pytest.mark.anyio
@asyncio_only
async def test_youzan_lag_per_partition(youzan_cluster) -> None:
    topic, channel = unique("lag"), "c"
    create_topic(youzan_cluster, topic, partitions=2, replicas=1, channel=channel)
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        for i in range(5):
            await producer.publish(topic, b"a%d" % i, partition=0)
        for i in range(3):
            await producer.publish(topic, b"b%d" % i, partition=1)
    result = await channel_lag(topic, channel, lookupd_http_addresses=lookupds(youzan_cluster))
    assert {r.partition: r.messages for r in result} == {0: 5, 1: 3}


@pytest.mark.integration
@pytest.mark.anyio
@asyncio_only
async def test_youzan_lag_counts_each_partition_once_however_asked(youzan_cluster) -> None:
    """Through nsqd HTTP the fork's answer was read as classic nsqd's: only the first
    partition of each nsqd, its depth (which counts what is in flight) plus in flight again;
    a lookupd consumer asked with nsqd addresses as well counted every partition twice."""
    topic, channel = unique("lagp"), "c"
    create_topic(youzan_cluster, topic, partitions=4, replicas=2, channel=channel, multipart=True)
    waiting = {0: 3, 1: 4, 2: 5, 3: 6}
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        for p, n in waiting.items():
            await producer.publish_many(topic, [b"x"] * n, partition=p)
    held: list[Message] = []
    release = anyio.Event()

    async def hold(message: Message) -> None:
        held.append(message)
        await release.wait()

    lookupd = lookupds(youzan_cluster)
    nsqds = [d.http for d in youzan_cluster.nsqd]
    async with Consumer(
        topic, channel, hold, lookupd_http_addresses=lookupd, max_in_flight=8
    ) as consumer:
        await wait_until(lambda: len(held) >= 4, 30, "messages in flight")
        answers = {
            "lookupd": await channel_lag(topic, channel, lookupd_http_addresses=lookupd),
            "nsqd": await channel_lag(topic, channel, nsqd_http_addresses=nsqds),
            "both": await channel_lag(
                topic, channel, lookupd_http_addresses=lookupd, nsqd_http_addresses=nsqds
            ),
            "consumer": await consumer.lag(nsqd_http_addresses=nsqds),
        }
        release.set()
    for how, result in answers.items():
        assert sorted((r.partition, r.messages) for r in result) == sorted(waiting.items()), how


@pytest.mark.integration
@pytest.mark.anyio
@asyncio_only
async def test_consumer_lag_async_and_blocking(classic_cluster) -> None:
    from smartnsq import sync

    topic, channel = unique("lag"), "c"
    nsqd = classic_cluster.nsqd[0]
    create_channel(nsqd.http, topic, channel)
    async with Producer(nsqd_tcp_addresses=[nsqd.tcp]) as producer:
        await producer.publish_many(topic, [b"x"] * 4)
    by_lookupd = Consumer(topic, channel, lookupd_http_addresses=lookupds(classic_cluster))
    assert [r.messages for r in await by_lookupd.lag()] == [4]
    direct = Consumer(topic, channel, nsqd_tcp_addresses=[nsqd.tcp])
    with pytest.raises(InvalidArgument, match="nsqd_http_addresses"):
        await direct.lag()
    assert [r.messages for r in await direct.lag(nsqd_http_addresses=[nsqd.http])] == [4]
    blocking = sync.Consumer(topic, channel, lookupd_http_addresses=lookupds(classic_cluster))
    lag = await anyio.to_thread.run_sync(blocking.lag)
    assert [r.messages for r in lag] == [4]


@pytest.mark.integration
def test_prometheus_lag_gauge(classic_cluster) -> None:
    from prometheus_client import CollectorRegistry

    from smartnsq import sync
    from smartnsq.observe import prometheus

    topic, channel = unique("lag"), "c"
    nsqd = classic_cluster.nsqd[0]
    create_channel(nsqd.http, topic, channel)
    with sync.Producer(nsqd_tcp_addresses=[nsqd.tcp]) as producer:
        producer.publish_many(topic, [b"x"] * 6)
    registry = CollectorRegistry()
    consumer = sync.Consumer(topic, channel, lookupd_http_addresses=lookupds(classic_cluster))
    prometheus.register(consumer, registry, lag_interval=0.05)
    labels = {"topic": topic, "channel": channel, "nsqd": nsqd.http, "partition": ""}
    try:
        wait_for(
            lambda: registry.get_sample_value("smartnsq_consumer_lag_messages", labels) == 6,
            what="the lag gauge",
        )
        with consumer:
            for n, message in enumerate(consumer, 1):
                message.finish()
                if n == 6:
                    break
        wait_for(
            lambda: registry.get_sample_value("smartnsq_consumer_lag_messages", labels) == 0,
            what="the lag gauge after consuming",
        )
    finally:
        prometheus.unregister(consumer, registry)
    assert registry.get_sample_value("smartnsq_consumer_lag_messages", labels) is None
