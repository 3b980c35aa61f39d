"""What observe/ reads of a consumer, through its public properties: ``topic``, ``channel``
and ``started`` (async and blocking)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from smartnsq import Consumer, Message
from smartnsq import sync as nsq_sync
from smartnsq.errors import InvalidArgument, NSQError
from smartnsq.observe import otel, prometheus
from tests.helpers import unique


def handle(message: Message) -> None:
    pass


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_async_consumer_says_once_it_has_started(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("state")
    consumer = Consumer(topic, "ch", handle, nsqd_tcp_addresses=[nsqd.tcp])
    assert (consumer.topic, consumer.channel, consumer.started) == (topic, "ch", False)
    otel.instrument(consumer)  # not started: allowed
    otel.uninstrument(consumer)
    async with consumer:
        assert consumer.started
        with pytest.raises(NSQError, match="before starting"):
            otel.instrument(consumer)
    assert consumer.started  # a Consumer starts once: stopped is not "not started"
    with pytest.raises(NSQError, match="before starting"):
        otel.uninstrument(consumer)


def test_the_sync_consumer_says_what_it_consumes_and_once_it_has_started(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("state")
    consumer = nsq_sync.Consumer(topic, "ch", handle, nsqd_tcp_addresses=[nsqd.tcp])
    assert (consumer.topic, consumer.channel, consumer.started) == (topic, "ch", False)
    otel.instrument(consumer)
    otel.uninstrument(consumer)
    with consumer:
        assert consumer.started
        with pytest.raises(NSQError, match="before starting"):
            otel.uninstrument(consumer)
    assert consumer.started
    with pytest.raises(NSQError, match="before starting"):
        otel.instrument(consumer)
    closed_unstarted = nsq_sync.Consumer(topic, "ch", handle, nsqd_tcp_addresses=[nsqd.tcp])
    closed_unstarted.close()
    assert closed_unstarted.started  # closed: it can no longer start


def test_prometheus_tells_sync_consumers_apart_by_topic_and_channel() -> None:
    registry = CollectorRegistry()
    topic = unique("state")
    a = nsq_sync.Consumer(topic, "one", handle, nsqd_tcp_addresses=["127.0.0.1:1"])
    b = nsq_sync.Consumer(topic, "two", handle, nsqd_tcp_addresses=["127.0.0.1:1"])
    same = nsq_sync.Consumer(topic, "one", handle, nsqd_tcp_addresses=["127.0.0.1:1"])
    prometheus.register(a, registry)
    prometheus.register(b, registry)  # another channel: another series
    with pytest.raises(InvalidArgument, match="same labels"):
        prometheus.register(same, registry)
    prometheus.register(same, registry, labels={"app": "x"})
    prometheus.unregister(a, registry)
    prometheus.unregister(b, registry)
    prometheus.unregister(same, registry)
