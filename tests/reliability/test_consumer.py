"""Consumer cases that lost messages, misreported them or stopped consuming.

Each test runs against a real nsqd (compat/); the only fake is a TCP server that answers
IDENTIFY with a malformed reply, which no real nsqd does. Server-side facts come from
nsqd's HTTP ``/stats``; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from functools import partial
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from smartnsq import Consumer, Message, Producer
from smartnsq.lookup.manager import LookupManager
from smartnsq.protocol.message import MessageLayout
from tests.helpers import (
    channel_stats,
    create_channel,
    fake_nsqd,
    lookupds,
    unique,
    wait_until,
)

pytestmark = [pytest.mark.reliability, pytest.mark.integration, pytest.mark.anyio]

LOGGER = "smartnsq.consumer"


def chan(http: str, topic: str, channel: str = "c") -> dict[str, Any]:
    return channel_stats(http, topic, channel) or {}


def only_client(http: str, topic: str, channel: str = "c") -> dict[str, Any] | None:
    clients = chan(http, topic, channel).get("clients") or []
    return clients[0] if len(clients) == 1 else None


def drained(http: str, topic: str, channel: str = "c") -> bool:
    s = chan(http, topic, channel)
    return bool(s) and s["depth"] == 0 and s["in_flight_count"] == 0 and s["deferred_count"] == 0


async def fresh_topic(nsqd: Any, prefix: str, bodies: list[bytes]) -> str:
    topic = unique(prefix)
    create_channel(nsqd.http, topic, "c")
    if bodies:
        async with Producer([nsqd.tcp]) as producer:
            await producer.publish_many(topic, bodies)
    return topic


# --------------------------------------------------------------------------- 1. awaitables


class _Forward:
    """A callable object whose plain ``__call__`` returns a coroutine."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, message: Message) -> Any:
        return self.fn(message)


@pytest.mark.parametrize("shape", ["lambda", "partial", "object"])
@pytest.mark.parametrize("auto_touch", [False, True], ids=["hot-path", "decoded-path"])
async def test_a_handler_returning_an_awaitable_has_it_awaited(
    classic_cluster, anyio_backend, shape, auto_touch
):
    """``lambda m: process(m)`` used to be FINed with ``process`` never run."""
    nsqd = classic_cluster.nsqd[0]
    topic = await fresh_topic(nsqd, "awaitable", [b"ok", b"fail"])
    ran: list[tuple[bytes, int]] = []

    async def process(message: Message, tag: str = "") -> None:
        await anyio.sleep(0)
        ran.append((message.body, message.attempts))
        if message.body == b"fail" and message.attempts == 1:
            raise RuntimeError("first attempt fails")

    handler: Any = {
        "lambda": lambda m: process(m),
        "partial": partial(process, tag="x"),
        "object": _Forward(process),
    }[shape]
    async with Consumer(
        topic,
        "c",
        handler,
        nsqd_tcp_addresses=[nsqd.tcp],
        requeue_delay=0,
        backoff=False,
        auto_touch=auto_touch,
    ) as c:
        await wait_until(
            lambda: sorted(ran) == [(b"fail", 1), (b"fail", 2), (b"ok", 1)], 10, "all runs"
        )
        await wait_until(lambda: drained(nsqd.http, topic), 5, "channel drained")
        client = only_client(nsqd.http, topic)
        assert client is not None
        assert (client["finish_count"], client["requeue_count"]) == (2, 1), client
        st = c.stats()
        assert (st.received, st.finished, st.requeued) == (3, 2, 1), st


# --------------------------------------------------------------------------- 2. sync handlers


async def test_a_sync_handler_blocking_past_two_heartbeats_keeps_its_connection(
    classic_cluster, anyio_backend
):
    """A plain handler that blocks 3 s with heartbeat_interval=1 used to block the loop: nsqd
    dropped the connection, the FIN went nowhere and was still counted as finished."""
    nsqd = classic_cluster.nsqd[0]
    topic = await fresh_topic(nsqd, "blocking", [])
    handled: list[bytes] = []

    def handler(message: Message) -> None:
        time.sleep(3)  # the blocking handler is the behaviour under test
        handled.append(message.body)

    async with Consumer(
        topic, "c", handler, nsqd_tcp_addresses=[nsqd.tcp], heartbeat_interval=1, msg_timeout=30
    ) as c:
        first = await wait_until(lambda: only_client(nsqd.http, topic), 10, "client in stats")
        identity = (first["remote_address"], first["connect_ts"])
        async with Producer([nsqd.tcp]) as producer:
            await producer.publish(topic, b"slow")
        await wait_until(lambda: handled, 10, "the slow message handled")
        await wait_until(lambda: drained(nsqd.http, topic), 5, "channel drained")
        client = only_client(nsqd.http, topic)
        assert client is not None
        assert (client["remote_address"], client["connect_ts"]) == identity, (client, identity)
        assert client["finish_count"] == 1 and client["requeue_count"] == 0, client
        s = chan(nsqd.http, topic)
        assert s["timeout_count"] == 0 and s["requeue_count"] == 0, s
        st = c.stats()
        assert (st.received, st.finished, st.requeued, st.connections) == (1, 1, 0, 1), st


async def test_an_answer_to_a_closed_connection_is_not_counted(classic_cluster, anyio_backend):
    """stats() counted a FIN written into a connection already gone; nsqd redelivered the
    message, so one message showed up as finished twice."""
    nsqd = classic_cluster.nsqd[0]
    topic = await fresh_topic(nsqd, "lostfin", [b"m"])
    started = anyio.Event()
    release = anyio.Event()

    async def handler(message: Message) -> None:
        if message.attempts == 1:
            started.set()
            await release.wait()

    async with Consumer(
        topic, "c", handler, nsqd_tcp_addresses=[nsqd.tcp], msg_timeout=1, reconnect_min=0.05
    ) as c:
        with anyio.fail_after(10):
            await started.wait()
        (reader,) = c._state.subs.values()
        reader.conn.queue(b"NOT_A_COMMAND\n")  # nsqd answers E_INVALID and hangs up
        await wait_until(lambda: reader.conn.closed, 5, "nsqd closed the connection")
        release.set()  # the handler returns: its FIN has no connection to go to
        await wait_until(
            lambda: (cl := only_client(nsqd.http, topic)) and cl["finish_count"] == 1,
            10,
            "redelivered on the new connection and finished",
        )
        assert drained(nsqd.http, topic)
        st = c.stats()
        assert (st.received, st.finished) == (2, 1), st


async def test_sync_handlers_run_off_the_loop_and_answer_from_their_thread(
    classic_cluster, anyio_backend, caplog
):
    nsqd = classic_cluster.nsqd[0]
    topic = await fresh_topic(nsqd, "thread", [b"fin", b"req", b"auto"])
    loop_thread = threading.get_ident()
    threads: set[int] = set()
    seen: list[tuple[bytes, int]] = []
    caplog.set_level(logging.WARNING, logger=LOGGER)

    def handler(message: Message) -> None:
        threads.add(threading.get_ident())
        message.touch()
        if message.body == b"fin":
            message.finish()
        elif message.body == b"req" and message.attempts == 1:
            message.requeue(0, backoff=False)
        seen.append((message.body, message.attempts))

    async with Consumer(topic, "c", handler, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=3) as c:
        await wait_until(lambda: len(seen) == 4, 10, "4 deliveries handled")
        await wait_until(lambda: drained(nsqd.http, topic), 5, "channel drained")
        client = only_client(nsqd.http, topic)
        assert client is not None
        assert (client["finish_count"], client["requeue_count"]) == (3, 1), client
        st = c.stats()
        assert (st.received, st.finished, st.requeued) == (4, 3, 1), st
    assert loop_thread not in threads
    assert sorted(seen) == [(b"auto", 1), (b"fin", 1), (b"req", 1), (b"req", 2)]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


async def test_graceful_stop_with_sync_handlers_loses_nothing(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    n = 40
    bodies = [f"m{i}".encode() for i in range(n)]
    topic = await fresh_topic(nsqd, "syncstop", bodies)
    handled: list[bytes] = []

    def slow(message: Message) -> None:
        time.sleep(0.05)
        handled.append(message.body)

    async with Consumer(
        topic, "c", slow, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=20, concurrency=2
    ) as c:
        await wait_until(lambda: len(handled) >= 4, 10, "a few handled")
    st = c.stats()
    assert len(set(handled)) == len(handled) < n
    await wait_until(
        lambda: (s := chan(nsqd.http, topic)) and s["in_flight_count"] == 0 and not s["clients"],
        5,
        "nothing in flight, client gone",
    )
    s = chan(nsqd.http, topic)
    assert s["depth"] == n - len(handled), s  # every unhandled one given back at once
    assert s["requeue_count"] == st.received - len(handled), (s, st)
    assert (st.finished, st.requeued) == (len(handled), st.received - len(handled)), st


async def test_stop_timeout_requeues_a_stuck_sync_handler_once(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    topic = await fresh_topic(nsqd, "syncstuck", [b"stuck"])
    started = threading.Event()
    gate = threading.Event()
    returned: list[bytes] = []

    def stuck(message: Message) -> None:
        started.set()
        gate.wait(20)
        returned.append(message.body)

    c = Consumer(topic, "c", stuck, nsqd_tcp_addresses=[nsqd.tcp])
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.run)
            await wait_until(started.is_set, 10, "handler running")
            await c.stop(timeout=0.3)
    await wait_until(
        lambda: (s := chan(nsqd.http, topic)) and s["depth"] == 1 and s["in_flight_count"] == 0,
        5,
        "the stuck message requeued",
    )
    gate.set()  # the handler returns late: its outcome must not answer again
    pool, inbox = c._threads.pool, c._threads.inbox
    assert pool is not None and inbox is not None
    await wait_until(lambda: returned and not pool.active, 5, "the handler returned, thread ended")
    inbox.drain()  # whatever it sent back is dealt with
    s = chan(nsqd.http, topic)
    assert (s["requeue_count"], s["depth"]) == (1, 1), s
    st = c.stats()
    assert (st.finished, st.requeued) == (0, 1), st


# --------------------------------------------------------------------------- 3. failure logs


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_handler_failure_is_logged_with_its_traceback_and_the_nsqd_id(
    classic_cluster, anyio_backend, kind, caplog
):
    nsqd = classic_cluster.nsqd[0]
    topic = await fresh_topic(nsqd, "faillog", [b"m"])
    ids: list[bytes] = []
    caplog.set_level(logging.WARNING, logger=LOGGER)

    def check(message: Message) -> None:
        ids.append(message.id)
        if message.attempts == 1:
            raise RuntimeError("handler broke")

    async def async_check(message: Message) -> None:
        check(message)

    handler: Any = check if kind == "sync" else async_check
    async with Consumer(
        topic, "c", handler, nsqd_tcp_addresses=[nsqd.tcp], requeue_delay=0, backoff=False
    ):
        await wait_until(lambda: len(ids) == 2, 10, "failed once, then handled")
        await wait_until(lambda: drained(nsqd.http, topic), 5, "channel drained")
    (record,) = [r for r in caplog.records if "handler failed" in r.getMessage()]
    assert record.exc_info is not None and isinstance(record.exc_info[1], RuntimeError)
    assert "handler broke" in "".join(caplog.text)
    # nsqd's ids are 16 hex characters in ASCII: printed as that text, not hexed again
    assert ids[0].decode() in record.getMessage(), record.getMessage()
    assert ids[0].hex() not in record.getMessage()


def test_id_text_shows_ids_as_nsqd_does():
    from smartnsq.consumer.message import delivered, id_text
    from smartnsq.protocol.frames import FRAME_MESSAGE, encode_frame

    def message(mid: bytes, binary: bool) -> Message:
        frame = encode_frame(
            FRAME_MESSAGE, (1).to_bytes(8, "big") + (1).to_bytes(2, "big") + mid + b"body"
        )
        sub: Any = SimpleNamespace(layout=MessageLayout(binary_id=binary))
        return delivered(sub, frame, 8, len(frame))

    assert id_text(message(b"0a1b2c3d4e5f6789", False)) == "0a1b2c3d4e5f6789"
    youzan = (1234567).to_bytes(8, "big") + (0).to_bytes(8, "big")
    assert id_text(message(youzan, True)) == "1234567"  # Youzan logs the internal id, decimal
    traced = (1234567).to_bytes(8, "big") + (89).to_bytes(8, "big")
    assert id_text(message(traced, True)) == "1234567 (trace id 89)"


# --------------------------------------------------------------------------- 4. False


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_handler_returning_false_requeues(classic_cluster, anyio_backend, kind):
    nsqd = classic_cluster.nsqd[0]
    topic = await fresh_topic(nsqd, "false", [b"m"])
    attempts: list[int] = []

    def check(message: Message) -> bool | None:
        attempts.append(message.attempts)
        return False if message.attempts == 1 else None

    async def async_check(message: Message) -> bool | None:
        return check(message)

    handler: Any = check if kind == "sync" else async_check
    async with Consumer(
        topic,
        "c",
        handler,
        nsqd_tcp_addresses=[nsqd.tcp],
        requeue_delay=0,
        backoff_unit=0.05,
    ) as c:
        await wait_until(lambda: attempts == [1, 2], 10, "requeued once, then finished")
        await wait_until(lambda: drained(nsqd.http, topic), 5, "channel drained")
        client = only_client(nsqd.http, topic)
        assert client is not None
        assert (client["finish_count"], client["requeue_count"]) == (1, 1), client
        st = c.stats()
        assert (st.finished, st.requeued) == (1, 1), st


# --------------------------------------------------------------------------- 5. bad nodes

MALFORMED = {
    "json-list": b"[1, 2]",
    "infinite-max-rdy": b'{"max_rdy_count": Infinity}',
    "not-a-number": b'{"max_rdy_count": "lots"}',
    "deeply-nested": b"[" * 100_000 + b"]" * 100_000,
}


@pytest.mark.parametrize("bad", ["nsqd-http-port", *MALFORMED])
async def test_one_bad_nsqd_does_not_stop_the_consumer(classic_cluster, anyio_backend, bad, caplog):
    nsqd = classic_cluster.nsqd[0]
    bodies = [f"m{i}".encode() for i in range(20)]
    topic = await fresh_topic(nsqd, "badnode", bodies)
    got: list[bytes] = []
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    async with contextlib.AsyncExitStack() as stack:
        if bad == "nsqd-http-port":
            address = nsqd.http
        else:
            address = await stack.enter_async_context(fake_nsqd(MALFORMED[bad]))

        def failures() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.getMessage().startswith(f"nsqd {address}:")]

        async with Consumer(
            topic,
            "c",
            lambda m: got.append(m.body),
            nsqd_tcp_addresses=[nsqd.tcp, address],
            reconnect_min=0.02,
            reconnect_max=0.1,
        ) as c:
            await wait_until(lambda: sorted(got) == sorted(bodies), 10, "every message")
            await wait_until(lambda: drained(nsqd.http, topic), 5, "channel drained")
            await wait_until(lambda: len(failures()) >= 3, 10, "the bad node retried")
            assert c.stats().finished == len(bodies)
    levels = [r.levelno for r in failures()]
    assert levels[0] == logging.WARNING and set(levels[1:]) == {logging.DEBUG}, levels


async def test_a_lookup_that_raises_does_not_stop_the_consumer(
    classic_cluster, anyio_backend, caplog, monkeypatch
):
    nsqd = classic_cluster.nsqd[0]
    bodies = [f"m{i}".encode() for i in range(5)]
    topic = await fresh_topic(nsqd, "badlookup", bodies)
    calls = 0

    async def broken_lookup(self: LookupManager, topic: str, access: str = "r") -> Any:
        nonlocal calls
        calls += 1
        raise KeyError("producers")  # say, a lookupd answer of an unexpected shape

    monkeypatch.setattr(LookupManager, "lookup", broken_lookup)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    got: list[bytes] = []
    async with Consumer(
        topic,
        "c",
        lambda m: got.append(m.body),
        nsqd_tcp_addresses=[nsqd.tcp],
        lookupd_http_addresses=lookupds(classic_cluster),
        lookupd_poll_interval=0.05,
    ):
        await wait_until(lambda: sorted(got) == sorted(bodies), 10, "every message")
        await wait_until(lambda: calls >= 2, 10, "lookupd polled again after the failure")
    records = [r for r in caplog.records if r.getMessage().startswith(f"lookup of {topic}")]
    levels = [r.levelno for r in records]
    assert levels[0] == logging.WARNING and set(levels[1:]) == {logging.DEBUG}, levels
