"""Partition offsets, start positions and SUB_ADVANCED against the real Youzan HA cluster."""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import math
import time
from collections import Counter

import anyio
import pytest

from compat.youzan import create_topic
from smartnsq import Consumer, Message, Producer, partition_offsets
from smartnsq.errors import InvalidArgument, NotSupported, OffsetOutOfRange, TopicNotFound
from smartnsq.protocol.message import partition_of
from tests.helpers import listed_producers, lookupds, unique, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
]

Body = tuple[int, bytes]  # (partition, body)


async def publish(cluster, topic: str, tag: str, per_partition: int, partitions=(0, 1)) -> list:
    bodies = []
    async with Producer(lookupd_http_addresses=lookupds(cluster)) as producer:
        for i in range(per_partition):
            for p in partitions:
                body = f"{tag}-p{p}-{i}".encode()
                await producer.publish(topic, body, partition=p)
                bodies.append((p, body))
    return bodies


async def offsets(cluster, topic: str, channel: str | None = "ch") -> dict:
    found = await partition_offsets(
        topic, lookupd_http_addresses=lookupds(cluster), channel=channel
    )
    return {o.partition: o for o in found}


async def drained(cluster, topic: str, channel: str) -> None:
    """Wait until no partition of the channel has an unfinished message."""
    with anyio.fail_after(30):
        while True:
            found = await offsets(cluster, topic, channel)
            if all(o.depth == 0 for o in found.values()):
                return
            await anyio.sleep(0.05)


async def consume(cluster, topic: str, channel: str, expected: int, **options) -> list[Message]:
    """Consume until ``expected`` messages arrived and the channel has nothing unfinished on
    any partition (so a stray extra delivery would have been seen)."""
    got: list[Message] = []
    async with Consumer(
        topic,
        channel,
        got.append,
        lookupd_http_addresses=lookupds(cluster),
        **{"max_in_flight": 20, **options},
    ):
        await wait_until(lambda: len(got) >= expected, 30, f"{expected} messages")
        await drained(cluster, topic, channel)
    return got


def bodies(messages: list[Message]) -> Counter[Body]:
    return Counter((m.partition, m.body) for m in messages)


async def test_partition_offsets_follow_what_is_published_and_consumed(
    youzan_cluster, anyio_backend
):
    topic = unique("offs")
    create_topic(youzan_cluster, topic, partitions=2, channel="ch")
    before = await offsets(youzan_cluster, topic)
    assert sorted(before) == [0, 1]
    for o in before.values():
        assert (o.earliest, o.end, o.end_count, o.channel, o.depth) == (0, 0, 0, 0, 0)
        assert o.nsqd and o.http and o.topic == topic

    sent = await publish(youzan_cluster, topic, "a", 6)
    sent += await publish(youzan_cluster, topic, "b", 3, partitions=(0,))
    after = await offsets(youzan_cluster, topic)
    assert [after[0].end_count, after[1].end_count] == [9, 6]
    assert [after[0].depth, after[1].depth] == [9, 6]  # nothing consumed yet
    assert [after[0].channel, after[1].channel] == [0, 0]

    # A new channel starts at the end (the fork's rule): "adv" reads from the earliest, with
    # SUB_ADVANCED: every message carries its offset and raw size, and they tile each
    # partition from earliest to end.
    got = await consume(youzan_cluster, topic, "adv", len(sent), advanced=True, start="earliest")
    assert bodies(got) == Counter(sent)
    for p in (0, 1):
        mine = sorted((m for m in got if m.partition == p), key=lambda m: m.offset or 0)
        assert all(m.offset is not None and m.raw_size for m in mine)
        assert mine[0].offset == after[p].earliest == 0
        for prev, nxt in itertools.pairwise(mine):
            assert nxt.offset == prev.offset + prev.raw_size
        assert mine[-1].offset + mine[-1].raw_size == after[p].end
    # Consuming "adv" moved that channel to the end; "ch" still has everything.
    adv = await offsets(youzan_cluster, topic, "adv")
    assert [(adv[p].channel, adv[p].depth, adv[p].channel_count) for p in (0, 1)] == [
        (after[0].end, 0, 9),
        (after[1].end, 0, 6),
    ]
    ch = await offsets(youzan_cluster, topic)
    assert [(ch[p].channel, ch[p].depth) for p in (0, 1)] == [(0, 9), (0, 6)]
    # A channel that does not exist: no position (and not some other channel's).
    none = await offsets(youzan_cluster, topic, "nosuch")
    assert [(none[p].channel, none[p].depth) for p in (0, 1)] == [(None, None), (None, None)]


async def test_start_earliest_rereads_a_consumed_channel(youzan_cluster, anyio_backend):
    topic = unique("early")
    create_topic(youzan_cluster, topic, partitions=2, channel="ch")
    sent = await publish(youzan_cluster, topic, "a", 5)
    first = await consume(youzan_cluster, topic, "ch", len(sent))
    assert bodies(first) == Counter(sent)
    # The channel is at its end; "earliest" reads all of it again, exactly once.
    again = await consume(youzan_cluster, topic, "ch", len(sent), start="earliest")
    assert bodies(again) == Counter(sent)


async def test_start_latest_skips_a_backlog(youzan_cluster, anyio_backend):
    topic = unique("late")
    create_topic(youzan_cluster, topic, partitions=2, channel="ch")
    await publish(youzan_cluster, topic, "old", 5)  # a backlog nobody consumed
    got: list[Message] = []
    async with Consumer(
        topic,
        "ch",
        got.append,
        lookupd_http_addresses=lookupds(youzan_cluster),
        max_in_flight=20,
        start="latest",
    ) as consumer:
        # Subscribed (and the start applied) on both partitions before publishing more.
        await wait_until(lambda: consumer.stats().connections == 2, 30, "2 connections")
        new = await publish(youzan_cluster, topic, "new", 3)
        await wait_until(lambda: len(got) >= len(new), 30, "the new messages")
        await drained(youzan_cluster, topic, "ch")
    assert bodies(got) == Counter(new)


async def test_start_latest_after_a_consumer_left_messages_requeued(youzan_cluster, anyio_backend):
    topic = unique("req")
    create_topic(youzan_cluster, topic, partitions=1, channel="ch")
    await publish(youzan_cluster, topic, "old", 8, partitions=(0,))
    held: list[Message] = []
    release = anyio.Event()

    async def hold(message: Message) -> None:
        held.append(message)
        await release.wait()

    # A consumer takes messages in flight and leaves: its stop requeues them.
    async with Consumer(
        topic, "ch", hold, lookupd_http_addresses=lookupds(youzan_cluster), max_in_flight=4
    ) as first:
        await wait_until(lambda: len(held) == 4, 30, "4 messages in flight")
        await first.stop(timeout=0)
    release.set()
    got = []
    async with Consumer(
        topic,
        "ch",
        got.append,
        lookupd_http_addresses=lookupds(youzan_cluster),
        max_in_flight=20,
        start="latest",
    ) as consumer:
        await wait_until(lambda: consumer.stats().connections == 1, 30, "subscribed")
        new = await publish(youzan_cluster, topic, "new", 3, partitions=(0,))
        await wait_until(lambda: len(got) >= len(new), 30, "the new messages")
        await drained(youzan_cluster, topic, "ch")
    assert bodies(got) == Counter(new)


async def test_start_at_a_time(youzan_cluster, anyio_backend):
    topic = unique("time")
    create_topic(youzan_cluster, topic, partitions=2, channel="ch")
    await publish(youzan_cluster, topic, "before", 4)
    # The fork resolves whole seconds: wait for the clock to reach the next one.
    boundary = math.floor(time.time()) + 1
    await wait_until(lambda: time.time() >= boundary, 3, "the next second")
    later = await publish(youzan_cluster, topic, "after", 3)
    got = await consume(youzan_cluster, topic, "ch", len(later), start=boundary + 0.5)
    assert bodies(got) == Counter(later)
    # The same instant as an aware datetime, on a new channel.
    start = dt.datetime.fromtimestamp(boundary, dt.UTC)
    got = await consume(youzan_cluster, topic, "other", len(later), start=start)
    assert bodies(got) == Counter(later)


async def test_start_at_explicit_offsets(youzan_cluster, anyio_backend):
    topic = unique("exp")
    create_topic(youzan_cluster, topic, partitions=2, channel="ch")
    sent = await publish(youzan_cluster, topic, "a", 5)
    probe = await consume(youzan_cluster, topic, "ch", len(sent), advanced=True)
    at = {(m.partition, m.body): m.offset for m in probe}
    start = {0: at[(0, b"a-p0-2")], 1: at[(1, b"a-p1-4")] - 1}  # p1: not on a boundary
    got = await consume(youzan_cluster, topic, "ch", 4, start=start)
    assert bodies(got) == Counter([(0, b"a-p0-2"), (0, b"a-p0-3"), (0, b"a-p0-4"), (1, b"a-p1-4")])
    # The offsets of SUB_ADVANCED deliveries start where they were asked to.
    assert min(m.offset for m in got if m.partition == 0) == start[0]


async def test_several_partitions_on_one_nsqd_each_start_at_their_own_offset(
    youzan_cluster, anyio_backend
):
    # 4 partitions on 2 nsqd: SUB_ADVANCED with its own start argument would be sent to a
    # partition of nsqd's choosing here (the fork's 5-token quirk).
    topic = unique("multi")
    create_topic(youzan_cluster, topic, partitions=4, multipart=True, channel="ch")
    sent = await publish(youzan_cluster, topic, "a", 3, partitions=range(4))
    probe = await consume(youzan_cluster, topic, "ch", len(sent), advanced=True)
    assert all(m.partition == partition_of(m.internal_id) for m in probe)
    at = {(m.partition, m.body): m.offset for m in probe}
    start = {p: at[(p, f"a-p{p}-{p % 3}".encode())] for p in range(4)}
    expected = Counter(b for b in sent if int(b[1].split(b"-")[2]) >= b[0] % 3)
    assert sum(expected.values()) == 9
    got = await consume(youzan_cluster, topic, "ch", 9, start=start)
    assert bodies(got) == expected
    assert all(m.partition == partition_of(m.internal_id) for m in got)


async def test_partitions_and_offsets_for_some_partitions(youzan_cluster, anyio_backend):
    topic = unique("some")
    create_topic(youzan_cluster, topic, partitions=2, channel="ch")
    sent = await publish(youzan_cluster, topic, "a", 3)
    first = await consume(youzan_cluster, topic, "ch", len(sent))
    assert bodies(first) == Counter(sent)
    # Only partition 1, from its start; partition 0 is neither consumed nor moved.
    got = await consume(youzan_cluster, topic, "ch", 3, partitions=[1], start={1: 0})
    assert bodies(got) == Counter(b for b in sent if b[0] == 1)
    found = await offsets(youzan_cluster, topic)
    assert found[0].channel == found[0].end


async def test_start_applies_once_not_on_reconnect(youzan_cluster, anyio_backend):
    topic = unique("once")
    create_topic(youzan_cluster, topic, partitions=1, channel="ch")
    sent = await publish(youzan_cluster, topic, "a", 4, partitions=(0,))
    await consume(youzan_cluster, topic, "ch", len(sent))
    got: list[Message] = []
    async with Consumer(
        topic,
        "ch",
        got.append,
        lookupd_http_addresses=lookupds(youzan_cluster),
        max_in_flight=20,
        start="earliest",
        reconnect_min=0.05,
    ) as consumer:
        # Handled is not yet finished: a def handler runs on a thread and its FIN reaches the
        # connection after; dropping the connection before then rightly redelivers.
        await wait_until(lambda: consumer.stats().finished >= len(sent), 30, "the re-read")
        # Drop the connection: the consumer reconnects and must not re-read from the start.
        (reader,) = consumer._state.subs.values()
        await reader.conn.close(timeout=1)
        await wait_until(
            lambda: (
                consumer.stats().connections == 1
                and next(iter(consumer._state.subs.values())) is not reader
            ),
            30,
            "a new connection",
        )
        more = await publish(youzan_cluster, topic, "b", 2, partitions=(0,))
        await wait_until(lambda: len(got) >= len(sent) + len(more), 30, "the new ones")
        found = await offsets(youzan_cluster, topic)
    assert bodies(got) == Counter(sent + more)
    assert found[0].depth == 0
    # A start implies SUB_ADVANCED, on the reconnected subscription too.
    last = max(got[-len(more) :], key=lambda m: m.offset or 0)
    assert last.offset is not None and last.offset + last.raw_size == found[0].end


async def test_start_leaves_a_channel_with_other_consumers_alone(
    youzan_cluster, anyio_backend, caplog
):
    topic = unique("busy")
    create_topic(youzan_cluster, topic, partitions=1, channel="ch")
    sent = await publish(youzan_cluster, topic, "a", 3, partitions=(0,))
    await consume(youzan_cluster, topic, "ch", len(sent))
    caplog.set_level(logging.WARNING, logger="smartnsq.offsets")
    other: list[Message] = []
    async with Consumer(
        topic, "ch", other.append, lookupd_http_addresses=lookupds(youzan_cluster)
    ) as first:
        await wait_until(lambda: first.stats().connections == 1, 30, "the first consumer")
        got: list[Message] = []
        async with Consumer(
            topic,
            "ch",
            got.append,
            lookupd_http_addresses=lookupds(youzan_cluster),
            start="earliest",
        ) as second:
            await wait_until(lambda: second.stats().connections == 1, 30, "the second")
            found = await offsets(youzan_cluster, topic)
    assert "other clients consume it" in caplog.text
    assert not got and not other  # nothing was moved back
    assert (found[0].channel, found[0].depth) == (found[0].end, 0)


async def test_start_on_an_ordered_topic(youzan_cluster, anyio_backend):
    topic = unique("ord")
    create_topic(youzan_cluster, topic, partitions=2, ordered=True, channel="ch")
    sent = await publish(youzan_cluster, topic, "a", 4)
    first = await consume(youzan_cluster, topic, "ch", len(sent))
    at = {(m.partition, m.body): m.offset for m in first}
    violations: list[Message] = []
    got = await consume(
        youzan_cluster,
        topic,
        "ch",
        3,
        start={0: at[(0, b"a-p0-1")]},
        on_order_violation=lambda m, i, o: violations.append(m),
    )
    assert [m.body for m in got] == [b"a-p0-1", b"a-p0-2", b"a-p0-3"]  # in order
    assert not violations


async def test_bad_start_and_partitions_are_refused_on_start(
    youzan_cluster, classic_cluster, anyio_backend
):
    topic = unique("bad")
    create_topic(youzan_cluster, topic, partitions=2, channel="ch")
    await publish(youzan_cluster, topic, "a", 2)
    end = (await offsets(youzan_cluster, topic))[0].end
    lookup = lookupds(youzan_cluster)

    async def start(expected: type[Exception], match: str, **options) -> None:
        consumer = Consumer(topic, "ch", lambda m: None, lookupd_http_addresses=lookup, **options)
        with pytest.raises(expected, match=match):
            async with consumer:
                pass

    await start(InvalidArgument, "no partition 2", partitions=[0, 2])
    await start(InvalidArgument, "no partition 5", start={5: 0})
    await start(OffsetOutOfRange, "outside what it holds", start={0: end + 1})
    with pytest.raises(TopicNotFound):
        await partition_offsets(unique("none"), lookupd_http_addresses=lookup)
    # Classic nsqd has no partitions or offsets.
    classic = lookupds(classic_cluster)
    async with Producer(classic_cluster.nsqd[0].tcp) as producer:
        await producer.publish("plain", b"x")
    await wait_until(lambda: listed_producers(classic[0], "plain"), 10, "lookupd to list the topic")
    with pytest.raises(NotSupported, match="Youzan"):
        await partition_offsets("plain", lookupd_http_addresses=classic)
    for options in ({"start": "earliest"}, {"partitions": [0]}, {"advanced": True}):
        consumer = Consumer("plain", "c", lambda m: None, lookupd_http_addresses=classic, **options)
        with pytest.raises(NotSupported, match="Youzan"):
            async with consumer:
                pass


async def test_advanced_on_an_ext_topic_keeps_headers_and_offsets(youzan_cluster, anyio_backend):
    topic = unique("ext")
    create_topic(youzan_cluster, topic, partitions=1, ext=True, channel="ch")
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        await producer.publish(topic, b"one", headers={"n": 1})
        await producer.publish(topic, b"two")
    got = await consume(youzan_cluster, topic, "ch", 2, start="earliest")
    one, two = sorted(got, key=lambda m: m.offset or 0)
    assert (one.body, one.headers, one.offset) == (b"one", {"n": 1}, 0)
    assert (two.body, two.headers, two.offset) == (b"two", {}, one.raw_size)
    end = (await offsets(youzan_cluster, topic))[0].end
    assert two.offset + two.raw_size == end


async def consume_once(cluster, topic: str, expected: int, **options) -> list[Message]:
    """:func:`consume`, checking that no ordered partition went backwards."""
    violations: list[Message] = []
    got = await consume(
        cluster,
        topic,
        "ch",
        expected,
        on_order_violation=lambda m, i, o: violations.append(m),
        **options,
    )
    assert not violations
    return got


async def test_start_earliest_on_an_ordered_channel_at_its_start_delivers_each_once(
    youzan_cluster, anyio_backend, caplog
):
    """The channel is at the earliest message already: moving it there anyway had the fork
    deliver the first message or two of each partition twice (one FIN refused)."""
    topic = unique("oearly")
    create_topic(youzan_cluster, topic, partitions=2, ordered=True, channel="ch")
    sent = await publish(youzan_cluster, topic, "a", 4)
    caplog.set_level(logging.WARNING, logger="smartnsq.consumer")
    got = await consume_once(youzan_cluster, topic, len(sent), start="earliest")
    assert not [r for r in caplog.records if "E_FIN_FAILED" in r.getMessage()]
    assert [(m.partition, m.body) for m in got if m.partition == 0] == [
        b for b in sent if b[0] == 0
    ]
    assert bodies(got) == Counter(sent)


@pytest.mark.parametrize("start", ["earliest", "offset", "time"])
@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "unordered"])
async def test_start_over_a_half_consumed_backlog_delivers_each_once(
    youzan_cluster, anyio_backend, ordered, start
):
    """The channel has messages waiting: nsqd holds the one at its position ready and
    delivers it first after the move, then again in its place (and on an ordered channel
    the first message twice, the first copy's FIN refused: a warning, nothing handled
    twice)."""
    topic = unique("ohalf")
    create_topic(youzan_cluster, topic, partitions=1, ordered=ordered, channel="ch")
    before = math.floor(time.time()) - 1  # a time before every message
    sent = await publish(youzan_cluster, topic, "a", 8, partitions=(0,))
    held: list[Message] = []
    release = anyio.Event()

    async def hold(message: Message) -> None:
        held.append(message)
        if len(held) >= 4:
            await release.wait()  # the fourth is in flight when the consumer leaves

    async with Consumer(
        topic,
        "ch",
        hold,
        lookupd_http_addresses=lookupds(youzan_cluster),
        max_in_flight=1,
        advanced=True,
    ) as first:
        await wait_until(lambda: len(held) == 4, 30, "4 messages handed on")
        await first.stop(timeout=0)
    release.set()
    position = {"earliest": "earliest", "time": before, "offset": {0: held[1].offset}}[start]
    if start == "offset":  # from the second message on
        sent = sent[1:]
    got = await consume_once(youzan_cluster, topic, len(sent), start=position, max_in_flight=1)
    assert bodies(got) == Counter(sent)  # each once
    if ordered:
        assert [m.body for m in got] == [b for _, b in sent]  # in order


@pytest.mark.parametrize("start", ["earliest", "latest", "time"])
async def test_start_on_an_empty_partition_subscribes_at_once(youzan_cluster, anyio_backend, start):
    """The fork answers a move on a partition nothing was published to with HTTP 500
    "commit log end of file": that is nothing to move, not a failed connection (which
    backed off for seconds before the first message came)."""
    topic = unique("empty")
    create_topic(youzan_cluster, topic, partitions=2, channel="ch")
    got: list[Message] = []
    async with Consumer(
        topic,
        "ch",
        got.append,
        lookupd_http_addresses=lookupds(youzan_cluster),
        start=time.time() - 60 if start == "time" else start,
    ) as consumer:
        await wait_until(lambda: consumer.stats().connections == 2, 5, "both partitions")
        new = await publish(youzan_cluster, topic, "new", 1)
        await wait_until(lambda: len(got) == len(new), 5, "the new messages")
        assert consumer.last_error is None
    assert bodies(got) == Counter(new)
