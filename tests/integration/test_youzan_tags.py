"""Tag dispatch (``desired_tag`` / ``##client_dispatch_tag``) against the real Youzan cluster."""

from __future__ import annotations

import anyio
import pytest

from compat.youzan import create_topic, lookup
from smartnsq import Consumer, Message, Producer
from smartnsq import sync as smartsync
from smartnsq.errors import (
    ExtNotSupported,
    InvalidArgument,
    InvalidTag,
    NotSupported,
    TagNotSupported,
)
from tests.helpers import channel_stats, lookupds, unique, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
]


def _leader_http(cluster, topic: str) -> str:
    node = lookup(cluster.lookupd[0].http, topic, "w")["partitions"]["0"]
    return f"{node['broadcast_address']}:{node['http_port']}"


async def test_each_tagged_consumer_gets_exactly_its_own_messages(youzan_cluster, anyio_backend):
    topic = unique("yzt")
    create_topic(youzan_cluster, topic, partitions=1, replicas=1, ext=True, channel="ch")
    got: dict[str, list[bytes]] = {"red": [], "blue": []}

    def handler(tag: str):
        def handle(message: Message) -> None:
            assert message.headers["##client_dispatch_tag"] == tag
            got[tag].append(message.body)

        return handle

    lk = lookupds(youzan_cluster)
    async with (
        Consumer(
            topic,
            "ch",
            handler("red"),
            lookupd_http_addresses=lk,
            desired_tag="red",
            max_in_flight=20,
        ),
        Consumer(
            topic,
            "ch",
            handler("blue"),
            lookupd_http_addresses=lk,
            desired_tag="blue",
            max_in_flight=20,
        ),
    ):
        http = _leader_http(youzan_cluster, topic)
        # publish only once both are subscribed: a tag nobody asked for goes to untagged ones
        await wait_until(
            lambda: len((channel_stats(http, topic, "ch") or {}).get("clients") or []) == 2,
            what="both consumers subscribed",
        )
        sent = {"red": [], "blue": []}
        async with Producer(lookupd_http_addresses=lk) as producer:
            for i in range(5):
                for tag in ("red", "blue"):
                    body = b"%s-%d" % (tag.encode(), i)
                    await producer.publish(topic, body, tag=tag)
                    sent[tag].append(body)
            bodies = [b"many-%d" % i for i in range(6)]
            tags = ["red", "blue", "red", "blue", "red", "blue"]
            await producer.publish_many(topic, bodies, tags=tags)
            for body, tag in zip(bodies, tags, strict=True):
                sent[tag].append(body)

        def blocking() -> None:
            with smartsync.Producer(lookupd_http_addresses=lk) as p:
                p.publish(topic, b"sync-blue", tag="blue")
                p.publish_many(topic, [b"sync-red"], tags=["red"])

        await anyio.to_thread.run_sync(blocking)
        sent["blue"].append(b"sync-blue")
        sent["red"].append(b"sync-red")
        await wait_until(lambda: len(got["red"]) + len(got["blue"]) >= 18, what="all 18 messages")
    assert sorted(got["red"]) == sorted(sent["red"])
    assert sorted(got["blue"]) == sorted(sent["blue"])


async def test_tag_errors(youzan_cluster, anyio_backend):
    plain = unique("yzt")
    create_topic(youzan_cluster, plain, partitions=1, replicas=1, channel="ch")
    lk = lookupds(youzan_cluster)
    async with Producer(lookupd_http_addresses=lk, max_retries=1) as producer:
        for bad in ("", "has space", "x" * 101, "ünï"):
            with pytest.raises(InvalidTag):
                await producer.publish(plain, b"x", tag=bad)
        with pytest.raises(InvalidArgument, match="one per message"):
            await producer.publish_many(plain, [b"a", b"b"], tags=["t"])
        with pytest.raises(InvalidArgument, match="trace_ids"):
            await producer.publish_many(plain, [b"a"], tags=["t"], trace_ids=[1])
        # the server is the one that knows the topic has no ext headers
        with pytest.raises(ExtNotSupported, match="ext topic"):
            await producer.publish(plain, b"x", tag="t")
        with pytest.raises(ExtNotSupported, match="ext topic"):
            await producer.publish_many(plain, [b"x"], tags=["t"])
        await producer.publish(plain, b"untagged still works")
    with smartsync.Producer(lookupd_http_addresses=lk) as blocking, pytest.raises(InvalidTag):
        blocking.publish(plain, b"x", tag="no/slash")

    with pytest.raises(InvalidArgument, match="ext"):
        Consumer(plain, "ch", lookupd_http_addresses=lk, desired_tag="t", ext=False)
    with pytest.raises(InvalidTag):
        Consumer(plain, "ch", lookupd_http_addresses=lk, desired_tag="a b")

    # nsqd would drop the tag on a topic without ext headers and deliver everything: refused
    received: list[Message] = []
    async with Consumer(
        plain, "ch", received.append, lookupd_http_addresses=lk, desired_tag="t"
    ) as consumer:
        await wait_until(lambda: consumer.last_error is not None, what="the refusal")
        assert isinstance(consumer.last_error, TagNotSupported)
        assert "desired_tag" in str(consumer.last_error)
        assert consumer.stats().connections == 0
    assert received == []


async def test_classic_nsqd_refuses_tags_and_ext_before_sending(classic_cluster, anyio_backend):
    topic = unique("ct")
    nsqd = [classic_cluster.nsqd[0].tcp]
    async with Producer(nsqd, compress_topics=[topic], compress_min_size=10) as producer:
        await producer.publish(topic, b"plain")  # connects; the connection stays usable
        for kwargs in ({"tag": "t"}, {"headers": {"k": "v"}}):
            with pytest.raises(NotSupported, match=r"classic nsqd.*tag"):
                await producer.publish(topic, b"x", **kwargs)
        with pytest.raises(NotSupported, match="compress_topics"):
            await producer.publish(topic, b"a body to compress " * 10)
        with pytest.raises(NotSupported, match="classic nsqd"):
            await producer.publish_many(topic, [b"x"], tags=["t"])
        await producer.publish(topic, b"short")
    with smartsync.Producer(nsqd) as blocking, pytest.raises(NotSupported, match="classic"):
        blocking.publish(topic, b"x", tag="t")
    got: list[Message] = []
    async with Consumer(topic, "ch", got.append, nsqd_tcp_addresses=nsqd, desired_tag="t") as c:
        await wait_until(lambda: c.last_error is not None, what="the refusal")
        assert isinstance(c.last_error, TagNotSupported)
        assert "classic nsqd" in str(c.last_error)
    assert got == []
