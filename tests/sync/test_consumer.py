"""The blocking Consumer against a real classic nsqd."""

from __future__ import annotations

import threading
import time

import pytest

from smartnsq.errors import InvalidArgument
from smartnsq.sync import Consumer, Producer
from smartnsq.sync.consumer import SETTLE_AFTER
from tests.helpers import channel_stats, create_channel, unique, wait_for

pytestmark = pytest.mark.integration


def fill(nsqd_tcp: str, topic: str, count: int) -> None:
    with Producer([nsqd_tcp]) as producer:
        producer.publish_many(topic, [b"m%d" % i for i in range(count)])


def settled(nsqd_http: str, topic: str, channel: str, depth: int) -> dict:
    """Nothing in flight and ``depth`` messages waiting (deferred ones included)."""
    return wait_for(
        lambda: (
            (s := channel_stats(nsqd_http, topic, channel))
            and s["in_flight_count"] == 0
            and s["depth"] + s["deferred_count"] == depth
            and s
        ),
        what=f"channel settled at depth {depth}",
    )


def test_iterating_finishes_every_message_once(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic, channel = unique("sit"), "c"
    create_channel(nsqd.http, topic, channel)
    fill(nsqd.tcp, topic, 200)
    seen = []
    with Consumer(topic, channel, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=20) as consumer:
        for message in consumer:
            seen.append(message.body)
            if len(seen) == 200:
                break
    stats = consumer.stats()  # after the stop: every answer is written
    assert sorted(seen) == sorted(b"m%d" % i for i in range(200))
    assert stats.finished == 200 and stats.requeued == 0
    s = settled(nsqd.http, topic, channel, 0)
    assert s["requeue_count"] == 0


def test_an_exception_in_the_loop_requeues_and_loses_nothing(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic, channel = unique("sraise"), "c"
    create_channel(nsqd.http, topic, channel)
    fill(nsqd.tcp, topic, 100)
    handled = 0
    with pytest.raises(RuntimeError, match="boom"):  # noqa: SIM117
        with Consumer(topic, channel, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=10) as c:
            for _ in c:
                handled += 1
                if handled == 30:
                    raise RuntimeError("boom")
    # 29 finished; the 30th went back as a failure (deferred by the requeue policy), and
    # everything held for this thread at once
    s = settled(nsqd.http, topic, channel, 71)
    assert s["deferred_count"] == 1


def test_a_thread_that_stops_mid_iteration_loses_nothing(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic, channel = unique("sthread"), "c"
    create_channel(nsqd.http, topic, channel)
    fill(nsqd.tcp, topic, 100)
    got: list[bytes] = []

    def work() -> None:
        with Consumer(topic, channel, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=25) as c:
            for message in c:
                got.append(message.body)
                if len(got) == 40:
                    return  # leaves the loop early: this one counts as handled

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(30)
    assert not thread.is_alive() and len(got) == 40
    settled(nsqd.http, topic, channel, 60)


def test_a_slow_loop_body_has_each_message_finished_when_it_takes_the_next(classic_cluster):
    """FINs of a fast burst go to the loop together; a loop body slower than that never
    holds back the FIN of the message before it."""
    nsqd = classic_cluster.nsqd[0]
    topic, channel = unique("sslow"), "c"
    create_channel(nsqd.http, topic, channel)
    fill(nsqd.tcp, topic, 5)
    with Consumer(topic, channel, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=5) as c:
        wait_for(lambda: c.stats().received == 5, what="all 5 received")
        it = iter(c)
        next(it)
        time.sleep(SETTLE_AFTER * 5)  # a slow loop body (not a wait for anything)
        next(it)  # more are waiting: no pause in which the FIN would go anyway
        wait_for(lambda: c.stats().finished == 1, what="the first FINed")
        for _ in range(3):
            next(it)
        del it  # leaves the loop: what was handled is finished, the current one is held
        wait_for(lambda: c.stats().finished == 4, what="all but the current FINed")
        assert c.stats().in_flight == 1
    assert c.stats().finished == 5
    settled(nsqd.http, topic, channel, 0)


def test_handler_form_runs_until_stopped(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic, channel = unique("shandler"), "c"
    create_channel(nsqd.http, topic, channel)
    fill(nsqd.tcp, topic, 50)
    seen: list[bytes] = []
    consumer: Consumer

    def handle(message):
        seen.append(message.body)
        if len(seen) == 51:  # the 50 and one redelivery
            consumer.stop()
        return message.body != b"m7" or message.attempts > 1  # False once: requeue

    consumer = Consumer(
        topic, channel, handle, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=5, requeue_delay=0
    )
    runner = threading.Thread(target=consumer.run)
    runner.start()
    try:
        runner.join(30)
        assert not runner.is_alive()
    finally:  # never leave a consuming thread behind (it would keep the process alive)
        consumer.stop()
        runner.join(15)
    assert seen.count(b"m7") == 2 and len(set(seen)) == 50
    s = settled(nsqd.http, topic, channel, 0)
    assert s["requeue_count"] == 1


def test_bad_arguments_raise_on_start():
    consumer = Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], max_in_flight=-1)
    with pytest.raises(InvalidArgument, match="max_in_flight"):
        consumer.start()


def test_a_bad_stop_timeout_raises_before_connecting():
    consumer = Consumer("t", "c", print, nsqd_tcp_addresses=["127.0.0.1:4150"])
    with pytest.raises(InvalidArgument, match="stop_timeout"):
        consumer.run(stop_timeout=-1)
    assert not consumer.started


def test_a_message_past_max_attempts_is_given_up_not_handed_over(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic, channel = unique("sgiveup"), "c"
    create_channel(nsqd.http, topic, channel)
    fill(nsqd.tcp, topic, 1)
    given_up: list[int] = []
    attempts: list[int] = []
    with Consumer(
        topic,
        channel,
        nsqd_tcp_addresses=[nsqd.tcp],
        max_attempts=2,
        on_giving_up=lambda m: given_up.append(m.attempts),
    ) as c:

        def work() -> None:
            for message in c:
                attempts.append(message.attempts)
                message.requeue(0, backoff=False)

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        wait_for(lambda: given_up, what="the third delivery given up")
        c.stop()
        thread.join(10)
        assert not thread.is_alive()
    assert attempts == [1, 2] and given_up == [3]
    stats = c.stats()
    assert (stats.discarded, stats.requeued, stats.finished) == (1, 2, 0)
    settled(nsqd.http, topic, channel, 0)
