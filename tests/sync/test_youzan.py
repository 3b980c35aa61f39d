"""The blocking Consumer on ordered partitions of the real Youzan HA cluster."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest

from compat.youzan import create_topic
from smartnsq.sync import Consumer, Producer
from tests.helpers import lookupds, unique

pytestmark = pytest.mark.integration

KEYS = [f"k{k}" for k in range(40)]
PER_KEY = 25
TOTAL = PER_KEY * len(KEYS)


def ordered_topic(cluster, prefix: str) -> tuple[str, dict[str, list[int]]]:
    """A new ordered topic of 4 partitions (channel "ch") holding TOTAL keyed messages:
    its name, and the sequence numbers sent per key."""
    topic = unique(prefix)
    create_topic(cluster, topic, partitions=4, replicas=1, ordered=True, channel="ch")
    return topic, publish_keyed(cluster, topic)


def publish_keyed(cluster, topic: str) -> dict[str, list[int]]:
    sent: dict[str, list[int]] = defaultdict(list)
    with Producer(lookupd_http_addresses=lookupds(cluster)) as producer:
        for seq in range(PER_KEY):
            for key in KEYS:
                producer.publish(topic, f"{key}:{seq}".encode(), sharding_key=key)
                sent[key].append(seq)
    return sent


def record(seen: dict[str, list[int]], body: bytes) -> None:
    key, seq = body.decode().rsplit(":", 1)
    seen[key].append(int(seq))


def test_iterating_an_ordered_topic_keeps_every_key_in_order(youzan_cluster):
    topic, sent = ordered_topic(youzan_cluster, "sord")
    seen: dict[str, list[int]] = defaultdict(list)
    violations: list[object] = []
    partitions: set[int] = set()
    with Consumer(
        topic,
        "ch",
        lookupd_http_addresses=lookupds(youzan_cluster),
        max_in_flight=8,
        on_order_violation=lambda m, i, o: violations.append(m),
    ) as consumer:
        for count, message in enumerate(consumer, 1):
            assert message.partition is not None and message.offset is not None
            partitions.add(message.partition)
            record(seen, message.body)
            if count == TOTAL:
                break
    stats = consumer.stats()
    assert not violations
    assert partitions == {0, 1, 2, 3}
    assert dict(seen) == dict(sent)  # every key complete, in order, nothing twice
    assert stats.finished == TOTAL and stats.requeued == 0


def test_a_thread_leaving_an_ordered_topic_early_hands_the_rest_on_in_order(youzan_cluster):
    """A consumer thread that stops mid-way: the next consumer continues each key in order."""
    topic, sent = ordered_topic(youzan_cluster, "sordx")
    seen: dict[str, list[int]] = defaultdict(list)
    first = 300

    def work() -> None:
        with Consumer(topic, "ch", lookupd_http_addresses=lookupds(youzan_cluster)) as c:
            for n, message in enumerate(c, 1):
                record(seen, message.body)
                if n == first:
                    return  # leaves early: this one counts as handled

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()

    with Consumer(topic, "ch", lookupd_http_addresses=lookupds(youzan_cluster)) as consumer:
        for count, message in enumerate(consumer, first + 1):
            record(seen, message.body)
            if count == TOTAL:
                break
    # no message lost, none repeated, every key still in order across the two consumers
    assert dict(seen) == dict(sent)


def test_a_slow_loop_body_on_an_ordered_topic_handles_each_message_once(youzan_cluster, caplog):
    """The loop body is the handler: while it runs longer than nsqd's message timeout,
    its ordered message is touched, as a handler's is. Untouched, nsqd timed it out: its
    FIN was refused and it came back (attempts 2), handled a second time; and one of
    another partition, waiting its turn, timed out the same way."""
    topic = unique("sslow")
    create_topic(youzan_cluster, topic, partitions=2, replicas=1, ordered=True, channel="ch")
    with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        for n in range(4):
            producer.publish(topic, b"%d" % n, partition=n % 2)
    seen: list[tuple[int, int]] = []
    with Consumer(
        topic, "ch", lookupd_http_addresses=lookupds(youzan_cluster), msg_timeout=2
    ) as consumer:
        for message in consumer:
            seen.append((int(message.body), message.attempts))
            time.sleep(2.6)  # the slow work itself, longer than the message timeout
            if len({n for n, _ in seen}) == 4:
                break
        stats = consumer.stats()
    assert sorted(seen) == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert stats.refused == 0
    assert not [r for r in caplog.records if "E_FIN_FAILED" in r.getMessage()]
