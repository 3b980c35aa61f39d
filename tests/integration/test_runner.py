"""smartnsq.serve in a running event loop, against a real nsqd (signals: tests/reliability)."""

from __future__ import annotations

from functools import partial
from typing import Any

import anyio
import pytest

from smartnsq import Consumer, Message, Producer, serve
from smartnsq.errors import NSQError
from tests.helpers import channel_stats, create_channel, topic_stats, unique, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


def chan(http: str, topic: str, channel: str) -> dict[str, Any]:
    return channel_stats(http, topic, channel) or {}


def rdy_zero(http: str, topic: str, channel: str) -> bool:
    """nsqd shows the (single) client at RDY 0: the graceful stop has begun."""
    clients = chan(http, topic, channel).get("clients") or []
    return len(clients) == 1 and clients[0]["ready_count"] == 0


def gone_and_answered(http: str, topic: str, channel: str) -> dict[str, Any] | None:
    """The channel's stats once the client is gone with nothing left in flight."""
    s = chan(http, topic, channel)
    return s if s and not s["clients"] and s["in_flight_count"] == 0 else None


async def fill(nsqd: Any, topic: str, channel: str, count: int) -> None:
    create_channel(nsqd.http, topic, channel)
    async with Producer([nsqd.tcp]) as producer:
        await producer.publish_many(topic, [b"m%d" % i for i in range(count)])


async def test_handlers_publish_while_the_consumers_drain(classic_cluster, anyio_backend):
    """main returning ends the run; the handlers still running at that point finish, and can
    publish, because producers are closed only after the consumers have stopped."""
    nsqd = classic_cluster.nsqd[0]
    topic, out, ch = unique("serve_in"), unique("serve_out"), "c"
    await fill(nsqd, topic, ch, 10)
    producer = Producer([nsqd.tcp])
    running: list[bytes] = []

    async def handle(message: Message) -> None:
        running.append(message.body)
        # Go on only once the stop has begun (nsqd sees RDY 0), then publish.
        await wait_until(lambda: rdy_zero(nsqd.http, topic, ch), 10, "RDY 0 from the stop")
        await producer.publish(out, b"from " + message.body)

    consumer = Consumer(
        topic, ch, handle, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=4, concurrency=2
    )

    async def main() -> None:
        await wait_until(lambda: len(running) == 2, 10, "two handlers running")

    with anyio.fail_after(30):
        await serve(consumer, producer, main=main, signals=())
    assert len(running) == 2, running
    stats = consumer.stats()
    assert (stats.finished, stats.in_flight) == (2, 0), stats
    assert stats.received == stats.finished + stats.requeued, stats
    assert (topic_stats(nsqd.http, out) or {}).get("message_count") == 2
    s = await wait_until(lambda: gone_and_answered(nsqd.http, topic, ch), 5, "client gone")
    assert s["depth"] == 8 and s["timeout_count"] == 0, s
    with pytest.raises(NSQError):  # closed once serve() returned
        await producer.publish(out, b"late")


async def test_cancelling_serve_still_stops_gracefully(classic_cluster, anyio_backend):
    """Cancelling serve() is a stop request: the stop is shielded, so the running handlers
    still finish and the waiting messages are requeued."""
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("serve_cancel"), "c"
    await fill(nsqd, topic, ch, 10)
    running: list[bytes] = []
    done: list[bytes] = []

    async def handle(message: Message) -> None:
        running.append(message.body)
        await wait_until(lambda: rdy_zero(nsqd.http, topic, ch), 10, "RDY 0 from the stop")
        done.append(message.body)

    consumer = Consumer(
        topic, ch, handle, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=4, concurrency=2
    )
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(serve, consumer, signals=()))
            await wait_until(lambda: len(running) == 2, 10, "two handlers running")
            tg.cancel_scope.cancel()
    assert sorted(done) == sorted(running) and len(done) == 2
    stats = consumer.stats()
    assert stats.in_flight == 0 and stats.received == 2 + stats.requeued, stats
    s = await wait_until(lambda: gone_and_answered(nsqd.http, topic, ch), 5, "client gone")
    assert s["depth"] == 8 and s["requeue_count"] == stats.requeued >= 1, s


async def test_main_failure_is_raised_after_the_stop(classic_cluster, anyio_backend):
    """main's exception comes out of serve() as is, once the consumers have stopped."""
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("serve_fail"), "c"
    await fill(nsqd, topic, ch, 5)
    seen: list[bytes] = []

    async def handle(message: Message) -> None:
        seen.append(message.body)
        await anyio.sleep_forever()  # cancelled after stop_timeout, then requeued

    consumer = Consumer(topic, ch, handle, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=5)

    async def main() -> None:
        await wait_until(lambda: len(seen) == 5, 10, "five messages held")
        raise LookupError("main gave up")

    with anyio.fail_after(30), pytest.raises(LookupError, match="main gave up"):
        await serve(consumer, main=main, signals=(), stop_timeout=0.2)
    s = await wait_until(lambda: gone_and_answered(nsqd.http, topic, ch), 5, "client gone")
    assert (s["depth"], s["requeue_count"]) == (5, 5), s


async def test_run_ends_when_every_consumer_stopped(classic_cluster, anyio_backend):
    """No signal and no main: serve() returns once its consumers have been stopped (here by
    another task) and then closes the producers."""
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("serve_self_stop"), "c"
    await fill(nsqd, topic, ch, 3)
    handled: list[bytes] = []

    async def handle(message: Message) -> None:
        handled.append(message.body)

    consumer = Consumer(topic, ch, handle, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=3)
    producer = Producer([nsqd.tcp])
    returned = anyio.Event()

    async def serve_then_note() -> None:
        await serve(consumer, producer, signals=())
        returned.set()

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve_then_note)
            await wait_until(lambda: len(handled) == 3, 10, "three messages handled")
            assert not returned.is_set()
            await consumer.stop()
            await returned.wait()
    with pytest.raises(NSQError):
        await producer.publish(topic, b"late")
    s = await wait_until(lambda: gone_and_answered(nsqd.http, topic, ch), 5, "client gone")
    assert s["depth"] == 0, s


async def test_a_handler_that_stops_its_consumer_does_not_wait_for_itself(
    classic_cluster, anyio_backend
):
    """A handler may call ``Consumer.stop``: the stop waited for running handlers, this one
    among them, so it took the whole ``timeout`` (10 s) before it could end. It waits only
    for the others; nothing is left in flight."""
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("stop_in_handler"), "c"
    await fill(nsqd, topic, ch, 8)
    handled: list[bytes] = []
    took: list[float] = []
    consumer: Consumer

    async def handle(message: Message) -> None:
        handled.append(message.body)
        if len(handled) == 4:
            start = anyio.current_time()
            await consumer.stop()
            took.append(anyio.current_time() - start)

    consumer = Consumer(topic, ch, handle, nsqd_tcp_addresses=[nsqd.tcp])
    with anyio.fail_after(30):
        await consumer.run()
    assert len(handled) == 4
    assert took and took[0] < 5.0, took  # not the 10 s timeout
    s = await wait_until(lambda: gone_and_answered(nsqd.http, topic, ch), 5, "client gone")
    assert s["depth"] + s["deferred_count"] >= 4  # the rest (and the stopping one) wait
