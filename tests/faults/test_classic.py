"""Network faults between the clients and classic nsqd / nsqlookupd (Toxiproxy in between).

Each case: two nsqd and one lookupd, every port the clients use behind a proxy. Eight
publishers (tasks of one ``smartnsq.Producer``, or threads sharing one
``smartnsq.sync.Producer``) publish to both nsqd; a consumer (async handler, or a sync
``def`` handler) finds them through the lookupd. One nsqd's links (TCP and HTTP) get the
fault for a while, then heal. Asserted, for every fault:

* nothing acknowledged is missing from what the consumer handled afterwards;
* every failure raised to a publisher is a ``smartnsq.errors`` type;
* the healthy nsqd keeps flowing while the other is faulty: publishes keep being acknowledged
  (no gap longer than ``Settings.publish_stall_bound``, well under the time the faulty link
  takes to be given up) and messages handled from it;
* after the heal, the producer publishes to the node and the consumer gets its messages
  again within bounds derived from their settings (``Settings.producer_bound`` and
  ``consumer_bound``).
"""

from __future__ import annotations

import math
import time

import anyio
import anyio.to_thread
import pytest

from compat.toxiproxy import ProxiedClassic
from tests.faults.harness import CLIENTS, FAULTS, SLACK, Record, Settings, Target, wait
from tests.helpers import create_channel, unique

pytestmark = [pytest.mark.integration, pytest.mark.faults]

PACE = 0.02  # each publisher's pause between publishes: about 400 publishes/s in all


def run_node_fault(cluster: ProxiedClassic, clients_kind: str, fault: str) -> dict[str, float]:
    inject, hold, cut_off = FAULTS[fault]
    settings = Settings()
    topic, channel = unique("fault"), "ch"
    for d in cluster.cluster.nsqd:  # the topic is in the lookupd before anyone asks
        create_channel(d.http, topic, channel)
    bad, good = (p.address for p in cluster.nsqd_tcp)
    target = Target(
        topic,
        channel,
        nsqd_tcp=[bad, good],
        consumer_lookupd=[p.address for p in cluster.lookupd_http],
    )
    record = Record()
    clients = CLIENTS[clients_kind](target, settings, record, PACE)
    clients.start()
    try:
        # warm: both nodes publish and deliver
        wait(
            lambda: (
                record.handled_between(0, time.monotonic(), bad)
                and record.handled_between(0, time.monotonic(), good)
            ),
            20,
            "messages from both nsqd",
        )
        time.sleep(1.0)  # a second of normal operation to compare with
        started = time.monotonic()
        normal_rate = record.acked_between(started - 1.0, started)
        for proxy in cluster.nodes(0):
            inject(proxy)
        # hold the fault; then look at what flowed meanwhile
        time.sleep(hold)  # the fault's duration, not synchronisation
        healed = time.monotonic()
        for proxy in cluster.nodes(0):
            proxy.heal()
        during = (started + 0.5, healed)  # a publish in flight at the start may still finish
        acked_during = record.acked_between(*during)
        good_during = record.handled_between(*during, nsqd=good)
        seconds = during[1] - during[0]
        rates = (normal_rate, acked_during / seconds, good_during / seconds)
        gap = record.longest_gap(started, healed)
        # the healthy nsqd keeps flowing: publishes stuck on the faulty link do not hold up
        # the others (see Settings.publish_stall_bound), and messages keep coming from it
        assert gap <= settings.publish_stall_bound(), (gap, rates, record.summary())
        assert good_during > 0, f"nothing handled from the healthy nsqd; {record.summary()}"
        if cut_off:  # the fault took effect: nothing came from the node while it lasted
            assert record.handled_between(*during, nsqd=bad) == 0, record.summary()

        before = clients.producer_stats().nodes[bad].published

        def producer_back() -> bool:
            node = clients.producer_stats().nodes[bad]
            return node.published > before and not node.down

        wait(producer_back, settings.producer_bound(hold) + 5, "the producer using the nsqd")
        producer_took = time.monotonic() - healed
        wait(
            lambda: record.first_fresh_from(bad, healed),
            settings.producer_bound(hold) + settings.consumer_bound() + 5,
            "a message published after the heal, handled from the healed nsqd",
        )
        consumer_took = (record.first_fresh_from(bad, healed) or 0.0) - healed
        time.sleep(0.5)  # keep publishing to both for a moment: normal operation
        clients.stop_publishing()
        drained = time.monotonic()
        wait(
            lambda: not record.missing(),
            settings.drain_bound(),
            "every acknowledged message handled",
            record.describe_missing,
        )
        drain_took = time.monotonic() - drained
    finally:
        clients.close()

    assert not record.missing()
    foreign = record.foreign_errors()
    assert not foreign, f"errors that are not smartnsq.errors types: {foreign[:5]!r}"
    assert producer_took <= settings.producer_bound(hold), (producer_took, record.summary())
    assert consumer_took <= settings.producer_bound(hold) + settings.consumer_bound(), (
        consumer_took,
        record.summary(),
    )
    return {
        "acked_per_s_before_during": (rates[0], round(rates[1])),
        "longest_publish_stall_s": round(gap, 2),
        "producer_recovered_s": producer_took,
        "consumer_recovered_s": consumer_took,
        "drained_s": drain_took,
        "duplicates": record.duplicates(),
        "errors": len(record.errors),
        "error_kinds": sorted({type(e).__name__ for e in record.errors}),
    }


@pytest.mark.parametrize("clients", ["async", "sync"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_one_nsqd_faulty(proxied_classic, fault, clients):
    cluster = proxied_classic(nsqd=2)
    result = run_node_fault(cluster, clients, fault)
    print(f"\n{fault}/{clients}: {result}")


@pytest.mark.parametrize(
    ("fault", "clients"),
    [("silent", "async"), ("silent", "sync"), ("reset", "async"), ("refused", "sync")],
)
def test_one_of_two_lookupds_faulty(proxied_classic, fault, clients):
    """A consumer started while one of its two lookupds is faulty finds the nsqd through the
    other at once (every lookupd is asked concurrently; a useful answer is taken after a
    short grace), and keeps consuming; nothing acknowledged is lost."""
    cluster = proxied_classic(nsqd=1, lookupd=2)
    inject = FAULTS[fault][0]
    for proxy in cluster.lookupd_http[:1]:
        inject(proxy)
    settings = Settings()
    topic, channel = unique("lookupd"), "ch"
    create_channel(cluster.cluster.nsqd[0].http, topic, channel)
    target = Target(
        topic,
        channel,
        nsqd_tcp=[cluster.nsqd_tcp[0].address],
        consumer_lookupd=[p.address for p in cluster.lookupd_http],
    )
    record = Record()
    clients_ = CLIENTS[clients](target, settings, record, PACE)
    started = time.monotonic()
    clients_.start()
    try:
        # the healthy lookupd's answer is used after a grace of 0.25 s, not the silent one's
        # 5 s request timeout
        wait(lambda: record.handled_between(0, math.inf), 1.0 + SLACK, "a first message")
        took = time.monotonic() - started
        assert took <= 1.0 + SLACK
        time.sleep(settings.lookupd_poll_interval * 3)  # several polls with one lookupd faulty
        clients_.stop_publishing()
        wait(lambda: not record.missing(), settings.drain_bound(), "all", record.describe_missing)
    finally:
        clients_.close()
        cluster.toxiproxy.heal()
    assert not record.foreign_errors()
    assert not record.missing()
    print(f"\nlookupd {fault}/{clients}: first message after {took:.2f}s; {record.summary()}")


def test_a_consumer_started_while_its_lookupd_refuses_asks_again_soon(proxied_classic):
    """No lookupd answers a consumer's first lookups: it asks again after 1, 2, 4 s ...
    (capped by the poll interval), so it subscribes within seconds of the lookupd coming
    back. It used to wait a whole ``lookupd_poll_interval`` (60 s by default): a process
    starting 1,000 consumers, whose lookups timed out in the crowd, took 84 s to subscribe."""
    from smartnsq import Consumer, Message
    from smartnsq.sync import Producer as SyncProducer

    cluster = proxied_classic(nsqd=1, lookupd=1)
    topic, channel = unique("lookupd_back"), "ch"
    create_channel(cluster.cluster.nsqd[0].http, topic, channel)
    with SyncProducer([cluster.cluster.nsqd[0].tcp]) as producer:
        producer.publish(topic, b"waiting")  # kept for the channel until it subscribes
    lookupd = cluster.lookupd_http[0]
    lookupd.refuse()
    outage = 1.5  # the fault's duration: a few failed lookups happen in it
    bound = 4.0 + SLACK  # the back-off step reached by then (<= 4 s), and the connect

    async def main() -> float:
        got = anyio.Event()

        async def handler(message: Message) -> None:
            got.set()

        async with Consumer(
            topic,
            channel,
            handler,
            lookupd_http_addresses=[lookupd.address],
            lookupd_poll_interval=60.0,
        ):
            await anyio.sleep(outage)
            await anyio.to_thread.run_sync(lookupd.heal)
            healed = time.monotonic()
            with anyio.fail_after(bound):
                await got.wait()
            return time.monotonic() - healed

    try:
        took = anyio.run(main)
    finally:
        cluster.toxiproxy.heal()
    print(f"\nsubscribed {took:.2f}s after the lookupd came back")
    assert took <= bound
