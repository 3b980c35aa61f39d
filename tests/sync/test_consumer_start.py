"""The blocking Consumer's start position and partition offsets, on the real Youzan cluster."""

from __future__ import annotations

from collections import Counter

import pytest

import smartnsq.sync
from compat.youzan import create_topic
from tests.helpers import lookupds, unique

pytestmark = pytest.mark.integration


def test_blocking_consumer_and_offsets_with_a_start(youzan_cluster):
    topic = unique("sync")
    create_topic(youzan_cluster, topic, partitions=2, channel="ch")
    with smartnsq.sync.Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        sent = [(p, f"a-{p}-{i}".encode()) for i in range(3) for p in (0, 1)]
        for p, body in sent:
            producer.publish(topic, body, partition=p)
    lookup = lookupds(youzan_cluster)
    found = smartnsq.sync.partition_offsets(topic, lookupd_http_addresses=lookup, channel="ch")
    assert [(o.partition, o.end_count, o.depth) for o in found] == [(0, 3, 3), (1, 3, 3)]
    for start in (None, "earliest"):  # the channel's position, then all of it again
        got: list[tuple[int | None, bytes]] = []
        with smartnsq.sync.Consumer(
            topic, "ch", lookupd_http_addresses=lookup, max_in_flight=10, start=start
        ) as consumer:
            for message in consumer:
                got.append((message.partition, message.body))
                if len(got) == len(sent):
                    break
        assert Counter(got) == Counter(sent)
        found = smartnsq.sync.partition_offsets(topic, lookupd_http_addresses=lookup, channel="ch")
        assert [(o.channel, o.depth) for o in found] == [(o.end, 0) for o in found]
