"""Smoke test against the real Youzan HA cluster (etcd + nsqlookupd + 2 nsqd) from compat/."""

from __future__ import annotations

import random

import anyio
import pytest

from compat.youzan import create_topic
from smartnsq import Connection, ConnectionConfig, Producer
from smartnsq.errors import NotSupported, TopicNotExist
from smartnsq.protocol import MessageLayout, commands, decode_publish_response
from tests.helpers import drain

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


@pytest.fixture(scope="module")
def topic_layout(youzan_cluster):
    topic = f"smoke_{random.getrandbits(32):x}"
    info = create_topic(youzan_cluster, topic, partitions=2, replicas=1, channel="ch")
    nodes = {
        int(p): f"{n['broadcast_address']}:{n['tcp_port']}" for p, n in info["partitions"].items()
    }
    return topic, nodes


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_traced_publish_matches_ordered_read(topic_layout, anyio_backend):
    topic, nodes = topic_layout
    for partition, address in sorted(nodes.items()):
        conn = await Connection.open(address, ConnectionConfig())
        assert conn.features.youzan, conn.features.version
        async with anyio.create_task_group() as tg:
            tg.start_soon(conn.run)
            plain = await conn.request(commands.pub(topic, b"plain", partition), publish=True)
            assert decode_publish_response(plain) is None
            trace_id = random.getrandbits(63)
            raw = await conn.request(
                commands.pub_trace(topic, b"traced", trace_id, partition), publish=True
            )
            result = decode_publish_response(raw)
            await conn.close()
        assert result is not None
        assert result.trace_id == trace_id
        assert result.partition == partition
        assert result.size > 0

        got = await drain(
            address,
            topic,
            "ch",
            2,
            layout=MessageLayout(binary_id=True, offset=True),
            sub=commands.sub_ordered(topic, "ch", partition),
            distinct=True,
        )
        # The fork may deliver the first message of a freshly ordered channel twice (same id,
        # same offset): that is a redelivery, which ordered consumers must tolerate.
        unique = list({m.id: m for m in got}.values())
        first, second = unique
        assert all(m.offset == first.offset for m in got if m.id == first.id)
        assert (first.body, second.body) == (b"plain", b"traced")
        assert first.partition == second.partition == partition
        assert second.internal_id == result.internal_id
        assert second.trace_id == trace_id
        assert second.id == result.message_id
        assert second.offset == result.offset
        # Offsets and ids grow within a partition: offset(next) = offset + raw size.
        assert first.offset is not None and first.raw_size is not None
        assert second.offset == first.offset + first.raw_size
        assert second.internal_id > first.internal_id


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_producer_on_the_fork(topic_layout, anyio_backend):
    topic, nodes = topic_layout
    address = nodes[0]
    async with Producer([address], max_retries=0) as producer:
        await producer.publish(topic, b"default partition")  # nsqd picks the partition it leads
        with pytest.raises(NotSupported, match="DPUB"):
            await producer.publish(topic, b"x", delay=1)
        with pytest.raises(TopicNotExist):
            await producer.publish("no_such_topic_here", b"x")
