"""Consumer against real classic nsqd / nsqlookupd (v1.3.x) started by compat/.

Every wait is bounded (``wait_until`` polls with a deadline, ``anyio.fail_after`` around
blocking awaits); nothing sleeps to stand in for synchronisation. Server-side facts are read
from nsqd's HTTP ``/stats``.
"""

from __future__ import annotations

import logging
import signal
import time
from collections import Counter
from itertools import pairwise
from typing import Any

import anyio
import pytest

from compat.cluster import free_port
from smartnsq import Consumer, Producer
from smartnsq.errors import InvalidArgument, InvalidChannel, InvalidTopic, NSQError
from tests.helpers import (
    EVERY_LOOP,
    channel_stats,
    create_channel,
    http_json,
    listed_producers,
    unique,
    wait_for,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])


# --------------------------------------------------------------------------- helpers


def chan(http: str, topic: str, channel: str) -> dict[str, Any]:
    return channel_stats(http, topic, channel) or {}


def clients(http: str, topic: str, channel: str) -> list[dict[str, Any]]:
    return chan(http, topic, channel).get("clients") or []


def only_client(http: str, topic: str, channel: str) -> dict[str, Any] | None:
    """The single client subscribed to the channel, or None (no client, or several)."""
    cs = clients(http, topic, channel)
    return cs[0] if len(cs) == 1 else None


def ready_count(http: str, topic: str, channel: str) -> int | None:
    c = only_client(http, topic, channel)
    return None if c is None else int(c["ready_count"])


def summary(http: str, topic: str, channel: str) -> dict[str, Any]:
    """Channel counters and per-client counters, for failure messages."""
    s = chan(http, topic, channel)
    keys = ("depth", "in_flight_count", "deferred_count", "requeue_count", "timeout_count")
    ckeys = ("remote_address", "ready_count", "in_flight_count", "finish_count", "requeue_count")
    out: dict[str, Any] = {k: s.get(k) for k in keys}
    out["clients"] = [{k: c.get(k) for k in ckeys} for c in s.get("clients") or []]
    return out


def drained(http: str, topic: str, channel: str) -> bool:
    s = chan(http, topic, channel)
    return bool(s) and s["depth"] == 0 and s["in_flight_count"] == 0 and s["deferred_count"] == 0


async def publish(tcp: str, topic: str, bodies: list[bytes]) -> None:
    async with Producer([tcp]) as producer:
        await producer.publish_many(topic, bodies)


def bodies_for(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


async def fill_every_nsqd(cluster: Any, topic: str, channel: str, per: int) -> list[bytes]:
    """Create the channel on every nsqd and publish ``per`` distinct bodies to each."""
    expected: list[bytes] = []
    for i, d in enumerate(cluster.nsqd):
        create_channel(d.http, topic, channel)
        bodies = bodies_for(f"n{i}", per)
        expected += bodies
        await publish(d.tcp, topic, bodies)
    return expected


# --------------------------------------------------------------------------- basic


@EVERY_LOOP
@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_consume_basic(classic_cluster, anyio_backend, kind):
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("basic"), "c"
    create_channel(nsqd.http, topic, ch)
    expected = bodies_for("m", 100)
    await publish(nsqd.tcp, topic, expected)
    got: list[Any] = []

    if kind == "async":

        async def handler(message):
            got.append(message)

    else:

        def handler(message):  # type: ignore[misc]
            got.append(message)

    async with Consumer(topic, ch, handler, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=10) as c:
        await wait_until(lambda: len(got) >= 100, 15, "100 messages handled")
        await wait_until(lambda: c.stats().finished == 100, 5, "stats().finished == 100")
        await wait_until(lambda: drained(nsqd.http, topic, ch), 5, "channel drained")
        client = only_client(nsqd.http, topic, ch)
        assert client is not None and client["finish_count"] == 100, client
        assert client["requeue_count"] == 0, client
        st = c.stats()
        assert st.received == 100 and st.requeued == 0 and st.discarded == 0, st
        assert st.connections == 1, st
    assert sorted(m.body for m in got) == sorted(expected)
    now_ns = time.time_ns()
    for m in got:
        assert m.attempts == 1
        assert isinstance(m.id, bytes) and len(m.id) == 16
        assert m.nsqd_address == nsqd.tcp
        assert abs(now_ns - m.timestamp) < 120 * 10**9, m.timestamp
        assert m.has_responded
    assert len({m.id for m in got}) == 100


# --------------------------------------------------------------------------- 1. lookupd, 3 nsqd


@asyncio_only
async def test_lookupd_three_nsqd_every_message_exactly_once(cluster_factory, anyio_backend):
    cluster = cluster_factory("classic", nsqd=3, lookupd=2)
    topic, ch = unique("many"), "c"
    per = 10_000
    expected = await fill_every_nsqd(cluster, topic, ch, per)
    for d in cluster.nsqd:  # the topic copies messages to the channel asynchronously
        await wait_until(
            lambda d=d: chan(d.http, topic, ch).get("depth") == per,
            10,
            f"{per} messages in {d.name}'s channel",
        )
    seen: Counter[bytes] = Counter()

    async def handler(message):
        seen[message.body] += 1

    lookupds = [f"http://{cluster.lookupd[0].http}", cluster.lookupd[1].http]
    async with Consumer(
        topic, ch, handler, lookupd_http_addresses=lookupds, max_in_flight=300
    ) as c:
        await wait_until(lambda: c.stats().connections == 3, 10, "3 connections via lookupd")
        await wait_until(lambda: seen.total() >= 3 * per, 90, f"{3 * per} messages handled")
        await wait_until(lambda: c.stats().finished == 3 * per, 10, "stats().finished == 30000")
        for d in cluster.nsqd:
            await wait_until(lambda d=d: drained(d.http, topic, ch), 10, f"{d.name} drained")
            s = chan(d.http, topic, ch)
            assert s["requeue_count"] == 0 and s["timeout_count"] == 0, s
            assert sum(cl["finish_count"] for cl in s["clients"]) == per, s["clients"]
        st = c.stats()
        assert st.received == 3 * per and st.finished == 3 * per, st
    dups = {b: n for b, n in seen.items() if n > 1}
    assert not dups, f"{len(dups)} bodies handled more than once, e.g. {list(dups.items())[:5]}"
    missing = set(expected) - set(seen)
    assert not missing, f"{len(missing)} bodies never handled, e.g. {sorted(missing)[:5]}"
    assert set(seen) == set(expected)


# ------------------------------------------------------------------ 2. max_in_flight < conns


@asyncio_only
async def test_max_in_flight_below_connection_count_drains_all(cluster_factory, anyio_backend):
    cluster = cluster_factory("classic", nsqd=3)
    topic, ch = unique("lowrdy"), "c"
    per = 300
    expected = await fill_every_nsqd(cluster, topic, ch, per)
    seen: Counter[bytes] = Counter()
    running = 0
    max_running = 0

    async def handler(message):
        nonlocal running, max_running
        running += 1
        max_running = max(max_running, running)
        try:
            await anyio.sleep(0)
            seen[message.body] += 1
        finally:
            running -= 1

    async with Consumer(
        topic,
        ch,
        handler,
        nsqd_tcp_addresses=[d.tcp for d in cluster.nsqd],
        max_in_flight=2,
        rdy_redistribute_interval=0.5,
        low_rdy_idle_timeout=1.0,
    ) as c:
        await wait_until(lambda: c.stats().connections == 3, 10, "3 connections")
        await wait_until(
            lambda: set(seen) >= set(expected),
            60,
            "all messages of all three nsqd handled with max_in_flight=2",
        )
        for d in cluster.nsqd:
            await wait_until(
                lambda d=d: drained(d.http, topic, ch), 10, f"{d.name} channel depth 0"
            )
    assert set(seen) == set(expected)
    assert max_running <= 2, f"{max_running} handlers ran at once with max_in_flight=2"


# --------------------------------------------------------------------------- 3. kill -9 + restart


@asyncio_only
@pytest.mark.parametrize("mode", ["lookupd", "direct"])
async def test_reconnects_after_nsqd_kill9_and_restart(cluster_factory, anyio_backend, mode):
    cluster = cluster_factory("classic", nsqd=2)
    topic, ch = unique(f"kill_{mode}"), "c"
    n0, n1 = cluster.nsqd
    for d in cluster.nsqd:
        create_channel(d.http, topic, ch)
    before0, before1 = bodies_for("a0", 3000), bodies_for("a1", 3000)
    await publish(n0.tcp, topic, before0)
    await publish(n1.tcp, topic, before1)
    seen: Counter[bytes] = Counter()

    async def handler(message):
        await anyio.sleep(0.005)
        seen[message.body] += 1

    if mode == "lookupd":
        addrs: dict[str, Any] = {
            "lookupd_http_addresses": [cluster.lookupd[0].http],
            "lookupd_poll_interval": 0.5,
            "lookupd_poll_jitter": 0.1,
        }
    else:
        addrs = {"nsqd_tcp_addresses": [n0.tcp, n1.tcp]}
    async with Consumer(
        topic, ch, handler, max_in_flight=10, reconnect_min=0.1, reconnect_max=0.5, **addrs
    ) as c:
        await wait_until(lambda: c.stats().connections == 2, 10, "2 connections")
        await wait_until(
            lambda: sum(seen[b] for b in before0) >= 100, 15, "consumption from nsqd0 started"
        )
        cluster.kill_nsqd(0, signal=signal.SIGKILL)
        await wait_until(
            lambda: c.stats().connections == 1, 10, "consumer to notice the killed nsqd"
        )
        cluster.restart_nsqd(0)
        create_channel(n0.http, topic, ch)  # idempotent; in case metadata was not persisted
        await wait_until(
            lambda: c.stats().connections == 2, 20, f"reconnect to the restarted nsqd ({mode})"
        )
        after0, after1 = bodies_for("b0", 200), bodies_for("b1", 200)
        await publish(n0.tcp, topic, after0)
        await publish(n1.tcp, topic, after1)
        must = set(before1) | set(after0) | set(after1)
        await wait_until(
            lambda: not (must - set(seen)),
            30,
            "every message of the surviving nsqd and every message published after the restart",
        )
        await wait_until(lambda: drained(n0.http, topic, ch), 10, "restarted nsqd0 drained")
        await wait_until(lambda: drained(n1.http, topic, ch), 10, "nsqd1 drained")
        assert c.stats().connections == 2
        assert len(clients(n0.http, topic, ch)) == 1
        assert len(clients(n1.http, topic, ch)) == 1


# --------------------------------------------------------------------------- 4. backoff


@asyncio_only
async def test_backoff_visible_in_nsqd_ready_count(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("backoff"), "c"
    create_channel(nsqd.http, topic, ch)
    failing = True
    ok: set[bytes] = set()
    failures = 0

    async def handler(message):
        nonlocal failures
        if failing:
            await anyio.sleep(0.3)  # keeps the "testing the waters" RDY 1 visible in /stats
            failures += 1
            raise RuntimeError("simulated failure")
        ok.add(message.body)

    rdy = lambda: ready_count(nsqd.http, topic, ch)  # noqa: E731
    async with Consumer(
        topic,
        ch,
        handler,
        nsqd_tcp_addresses=[nsqd.tcp],
        max_in_flight=5,
        max_attempts=0,
        requeue_delay=0,
        backoff_unit=0.2,
        max_backoff_duration=2,
    ) as c:
        await wait_until(lambda: rdy() == 5, 10, "initial RDY 5 in nsqd stats")
        expected = bodies_for("m", 30)
        await publish(nsqd.tcp, topic, expected)
        await wait_until(lambda: failures >= 1, 10, "first handler failure")
        await wait_until(lambda: rdy() == 0, 10, "RDY 0 (backoff) in nsqd stats")
        assert c.stats().backoff_level >= 1, c.stats()
        await wait_until(lambda: rdy() == 1, 10, "RDY 1 (testing the waters) in nsqd stats")
        failing = False
        await wait_until(
            lambda: rdy() == 5 and c.stats().backoff_level == 0,
            30,
            "RDY back to max_in_flight=5 and backoff_level 0 after the handler recovered",
        )
        await wait_until(lambda: ok >= set(expected), 20, "all messages handled successfully")
        await wait_until(lambda: drained(nsqd.http, topic, ch), 10, "channel drained")
        assert c.stats().requeued >= 1


@asyncio_only
async def test_backoff_probe_moves_on_from_an_idle_nsqd(cluster_factory, anyio_backend):
    """Two nsqd, messages on one: after each backoff window the probe (RDY 1) must reach the
    nsqd that has them. It stayed on one picked at random, and the consumer stalled."""
    cluster = cluster_factory("classic", nsqd=2)
    topic, ch = unique("probe"), "c"
    for d in cluster.nsqd:
        create_channel(d.http, topic, ch)
    expected = bodies_for("p", 20)
    await publish(cluster.nsqd[0].tcp, topic, expected)
    failures = 0
    ok: set[bytes] = set()

    async def handler(message):
        nonlocal failures
        if failures < 6:  # six backoff windows, six probes
            failures += 1
            raise RuntimeError("simulated failure")
        ok.add(message.body)

    async with Consumer(
        topic,
        ch,
        handler,
        nsqd_tcp_addresses=[d.tcp for d in cluster.nsqd],
        requeue_delay=0,
        backoff_unit=0.01,
    ):
        await wait_until(lambda: ok >= set(expected), 60, "every message handled")


# --------------------------------------------------------------------------- 5. heartbeats


@asyncio_only
async def test_slow_handler_longer_than_heartbeat_keeps_connection(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("hb"), "c"
    create_channel(nsqd.http, topic, ch)
    done = anyio.Event()
    started = anyio.Event()

    async def handler(message):
        started.set()
        await anyio.sleep(3.5)
        done.set()

    async with Consumer(
        topic,
        ch,
        handler,
        nsqd_tcp_addresses=[nsqd.tcp],
        heartbeat_interval=1,
        msg_timeout=30,
    ) as c:
        first = await wait_until(lambda: only_client(nsqd.http, topic, ch), 10, "client in stats")
        identity = (first["remote_address"], first["connect_ts"])
        observed_identities: set[tuple[str, int]] = set()
        observed_conns: set[int] = set()
        await publish(nsqd.tcp, topic, [b"slow"])

        async def watch() -> None:
            while not done.is_set():
                for cl in clients(nsqd.http, topic, ch):
                    observed_identities.add((cl["remote_address"], cl["connect_ts"]))
                if not clients(nsqd.http, topic, ch):
                    observed_identities.add(("<no client>", 0))
                observed_conns.add(c.stats().connections)
                await anyio.sleep(0.1)

        with anyio.fail_after(10):
            await started.wait()
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                await done.wait()
        await wait_until(
            lambda: (
                (cl := only_client(nsqd.http, topic, ch)) is not None and cl["finish_count"] == 1
            ),
            5,
            "finish_count 1 on the original client",
        )
        cl = only_client(nsqd.http, topic, ch)
        assert cl is not None
        assert (cl["remote_address"], cl["connect_ts"]) == identity, (cl, identity)
        assert observed_identities == {identity}, observed_identities
        assert observed_conns == {1}, observed_conns
        s = chan(nsqd.http, topic, ch)
        assert s["timeout_count"] == 0 and s["requeue_count"] == 0, s
        assert drained(nsqd.http, topic, ch), s
        assert c.stats().finished == 1


# --------------------------------------------------------------------------- 6. giving up


async def test_gives_up_after_max_attempts(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("giveup"), "c"
    create_channel(nsqd.http, topic, ch)
    calls: list[int] = []
    gave_up: list[Any] = []

    async def handler(message):
        calls.append(message.attempts)
        raise RuntimeError("always fails")

    async with Consumer(
        topic,
        ch,
        handler,
        nsqd_tcp_addresses=[nsqd.tcp],
        max_attempts=3,
        requeue_delay=0,
        backoff=False,
        on_giving_up=gave_up.append,
    ) as c:
        await wait_until(lambda: only_client(nsqd.http, topic, ch), 10, "client in stats")
        await publish(nsqd.tcp, topic, [b"poison"])
        await wait_until(lambda: gave_up, 15, "on_giving_up to be called")
        await wait_until(
            lambda: (
                (cl := only_client(nsqd.http, topic, ch)) is not None and cl["finish_count"] == 1
            ),
            5,
            "the given-up message to be FINed",
        )
        await wait_until(lambda: drained(nsqd.http, topic, ch), 5, "channel drained")
        cl = only_client(nsqd.http, topic, ch)
        assert cl is not None and cl["requeue_count"] == 3, cl
        st = c.stats()
        assert st.discarded == 1 and st.requeued == 3, st
    assert calls == [1, 2, 3], calls
    assert len(gave_up) == 1, gave_up
    assert gave_up[0].body == b"poison"
    assert gave_up[0].attempts == 4


# --------------------------------------------------------------------------- 7. manual responses


async def test_manual_finish_and_requeue(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("manual"), "c"
    create_channel(nsqd.http, topic, ch)
    seen: list[Any] = []
    held: list[Any] = []

    async def handler(message):
        seen.append(message)
        if message.body.startswith(b"manual") and message.attempts == 1:
            message.disable_auto_response()
            held.append(message)

    def client_field(name: str) -> int | None:
        cl = only_client(nsqd.http, topic, ch)
        return None if cl is None else int(cl[name])

    async with Consumer(topic, ch, handler, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=2) as c:
        await wait_until(lambda: ready_count(nsqd.http, topic, ch) == 2, 10, "RDY 2")
        await publish(nsqd.tcp, topic, [b"manual-1"])
        await wait_until(lambda: len(held) == 1, 10, "manual-1 delivered")
        m1 = held[0]
        # Barrier: a normally handled message after it. Once its FIN reached nsqd, any
        # (wrong) automatic FIN for manual-1, queued earlier, would have reached it too.
        await publish(nsqd.tcp, topic, [b"auto-1"])
        await wait_until(lambda: client_field("finish_count") == 1, 10, "auto-1 FINed")
        assert chan(nsqd.http, topic, ch)["in_flight_count"] == 1, "manual-1 must stay in flight"
        assert not m1.has_responded
        assert c.stats().in_flight == 1, c.stats()
        m1.finish()
        assert m1.has_responded
        await wait_until(lambda: client_field("finish_count") == 2, 10, "manual-1 FINed")
        await wait_until(lambda: drained(nsqd.http, topic, ch), 5, "channel drained")

        await publish(nsqd.tcp, topic, [b"manual-2"])
        await wait_until(lambda: len(held) == 2, 10, "manual-2 delivered")
        m2 = held[1]
        m2.requeue(delay=0, backoff=False)
        assert m2.has_responded
        again = await wait_until(
            lambda: [m for m in seen if m.body == b"manual-2" and m.attempts == 2],
            10,
            "manual-2 redelivered",
        )
        assert again[0].id == m2.id
        await wait_until(lambda: client_field("finish_count") == 3, 10, "redelivery FINed")
        await wait_until(lambda: drained(nsqd.http, topic, ch), 5, "channel drained")
        assert client_field("requeue_count") == 1
        # backoff=False: no backoff, RDY stays at max_in_flight
        assert ready_count(nsqd.http, topic, ch) == 2
        assert c.stats().backoff_level == 0
    assert [m.body for m in seen] == [b"manual-1", b"auto-1", b"manual-2", b"manual-2"]


async def test_is_starved(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("starved"), "c"
    create_channel(nsqd.http, topic, ch)
    held: list[Any] = []

    async def handler(message):
        message.disable_auto_response()
        held.append(message)

    async with Consumer(topic, ch, handler, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=2) as c:
        await wait_until(lambda: ready_count(nsqd.http, topic, ch) == 2, 10, "RDY 2")
        assert not c.is_starved()
        await publish(nsqd.tcp, topic, [b"a", b"b"])
        await wait_until(lambda: len(held) == 2, 10, "2 messages held")
        assert c.is_starved(), "2 of 2 in flight must count as starved"
        for m in held:
            m.finish()
        await wait_until(lambda: not c.is_starved(), 5, "not starved after finishing")
        await wait_until(lambda: drained(nsqd.http, topic, ch), 5, "channel drained")


# --------------------------------------------------------------------------- 8. graceful stop


@pytest.mark.parametrize("how", ["context", "stop"])
async def test_graceful_stop_loses_nothing(classic_cluster, anyio_backend, how):
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique(f"stop_{how}"), "c"
    create_channel(nsqd.http, topic, ch)
    expected = bodies_for("m", 200)
    await publish(nsqd.tcp, topic, expected)
    first: list[bytes] = []

    async def slow(message):
        await anyio.sleep(0.2)
        first.append(message.body)  # handled; returning FINs it

    kw: dict[str, Any] = {"nsqd_tcp_addresses": [nsqd.tcp], "max_in_flight": 50}
    with anyio.fail_after(30):
        if how == "context":
            async with Consumer(topic, ch, slow, **kw):
                await wait_until(lambda: len(first) >= 50, 10, "first 50 handled")
                at_stop = len(first)
        else:
            c = Consumer(topic, ch, slow, **kw)
            async with anyio.create_task_group() as tg:
                tg.start_soon(c.run)
                await wait_until(lambda: len(first) >= 50, 10, "first 50 handled")
                at_stop = len(first)
                await c.stop(timeout=5)
            # run() returned (the task group exited)
    assert at_stop < 200, f"consumer finished everything ({at_stop}) before the stop"
    assert len(first) < 200, f"nothing left for the second consumer ({len(first)})"
    assert len(set(first)) == len(first), "first consumer handled a message twice"
    # After a graceful stop nothing is left in flight: each delivered message was finished
    # or given back; the client is gone.
    await wait_until(
        lambda: (
            (s := chan(nsqd.http, topic, ch)) and s["in_flight_count"] == 0 and not s.get("clients")
        ),
        5,
        "no in-flight message and no client after the graceful stop",
        describe=lambda: summary(nsqd.http, topic, ch),
    )
    second: list[bytes] = []

    async def fast(message):
        second.append(message.body)

    rest = set(expected) - set(first)
    async with Consumer(topic, ch, fast, **kw):
        await wait_until(
            lambda: set(second) >= rest,
            20,
            f"the {len(rest)} messages not finished by the first consumer",
        )
        await wait_until(lambda: drained(nsqd.http, topic, ch), 5, "channel drained")
    overlap = set(first) & set(second)
    assert not overlap, f"{len(overlap)} messages finished by the first consumer came back"
    assert Counter(second).most_common(1)[0][1] == 1, "second consumer got duplicates"
    assert set(first) | set(second) == set(expected)


async def test_stop_timeout_requeues_running_messages(classic_cluster, anyio_backend):
    """Handlers still running when stop()'s timeout expires are cancelled and their messages
    REQed at once: nsqd must see the REQs (not wait for msg_timeout)."""
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("stoptimeout"), "c"
    create_channel(nsqd.http, topic, ch)
    started: list[bytes] = []
    finished: list[bytes] = []

    async def stuck(message):
        started.append(message.body)
        await anyio.sleep(30)
        finished.append(message.body)

    expected = bodies_for("m", 5)
    await publish(nsqd.tcp, topic, expected)
    c = Consumer(topic, ch, stuck, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=5)
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.run)
            await wait_until(lambda: len(started) == 5, 10, "5 handlers running")
            await c.stop(timeout=0.5)
    assert not finished
    await wait_until(
        lambda: (
            (s := chan(nsqd.http, topic, ch))
            and s["in_flight_count"] == 0
            and s["depth"] == 5
            and s["requeue_count"] == 5
        ),
        5,
        "the 5 cancelled messages REQed (depth 5, nothing in flight)",
        describe=lambda: summary(nsqd.http, topic, ch),
    )
    assert c.stats().requeued == 5


# --------------------------------------------------------------------------- 9. non-fatal errors


@asyncio_only
async def test_non_fatal_fin_errors_keep_connection(classic_cluster, anyio_backend):
    """Double FIN and FIN after nsqd timed the message out: E_FIN_FAILED is not fatal."""
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("finfail"), "c"
    create_channel(nsqd.http, topic, ch)
    held: list[Any] = []
    auto: list[Any] = []

    async def handler(message):
        if message.attempts == 1:
            message.disable_auto_response()
            held.append(message)
        else:
            auto.append(message)

    def client_field(name: str) -> Any:
        cl = only_client(nsqd.http, topic, ch)
        return None if cl is None else cl[name]

    async with Consumer(
        topic, ch, handler, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=1, msg_timeout=2
    ) as c:
        await wait_until(lambda: ready_count(nsqd.http, topic, ch) == 1, 10, "RDY 1")
        addr = client_field("remote_address")
        # (a) finishing twice
        await publish(nsqd.tcp, topic, [b"a"])
        await wait_until(lambda: len(held) == 1, 10, "a delivered")
        held[0].finish()
        await wait_until(lambda: client_field("finish_count") == 1, 10, "a FINed")
        try:
            held[0].finish()  # either refused locally or sent and answered E_FIN_FAILED
        except NSQError:
            pass
        # (b) FIN for a message nsqd already timed out and requeued
        await publish(nsqd.tcp, topic, [b"b"])
        await wait_until(lambda: len(held) == 2, 10, "b delivered")
        c.set_max_in_flight(0)
        await wait_until(lambda: ready_count(nsqd.http, topic, ch) == 0, 5, "RDY 0")
        await wait_until(
            lambda: (
                (s := chan(nsqd.http, topic, ch))
                and s["timeout_count"] == 1
                and s["depth"] == 1
                and s["in_flight_count"] == 0
            ),
            10,
            "b to time out on nsqd (msg_timeout=2) and wait in the channel",
        )
        try:
            held[1].finish()
        except NSQError:
            pass
        c.set_max_in_flight(1)
        await wait_until(lambda: len(auto) == 1, 10, "b redelivered on the same connection")
        assert auto[0].body == b"b" and auto[0].attempts == 2
        await wait_until(lambda: client_field("finish_count") == 2, 10, "b's redelivery FINed")
        await wait_until(lambda: drained(nsqd.http, topic, ch), 5, "channel drained")
        assert client_field("remote_address") == addr, "the connection was replaced"
        assert len(clients(nsqd.http, topic, ch)) == 1
        assert c.stats().connections == 1


@asyncio_only
async def test_fatal_error_closes_the_connection_and_reconnect_takes_over(
    classic_cluster, anyio_backend, caplog
):
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("fatal"), "c"
    create_channel(nsqd.http, topic, ch)
    got: set[bytes] = set()
    caplog.set_level(logging.WARNING, logger="smartnsq")
    async with Consumer(
        topic,
        ch,
        lambda m: got.add(m.body),
        nsqd_tcp_addresses=[nsqd.tcp],
        max_in_flight=5,
        reconnect_min=0.05,
    ) as c:
        await wait_until(lambda: c.stats().connections == 1, 10, "connected")
        first = only_client(nsqd.http, topic, ch)
        assert first is not None
        (reader,) = c._state.subs.values()
        reader.write(b"RDY 999999\n")  # over max_rdy_count: nsqd answers E_INVALID, fatal
        await wait_until(
            lambda: any("E_INVALID" in r.getMessage() for r in caplog.records), 10, "E_INVALID"
        )
        await wait_until(
            lambda: (
                (cl := only_client(nsqd.http, topic, ch)) is not None
                and cl["remote_address"] != first["remote_address"]
            ),
            10,
            "a new connection replacing the closed one",
        )
        bodies = bodies_for("after", 20)
        await publish(nsqd.tcp, topic, bodies)
        await wait_until(lambda: set(bodies) <= got, 10, "consuming again")
        assert c.stats().connections == 1


# --------------------------------------------------------------------------- 10. bad config


def test_invalid_configuration():
    async def h(message):
        pass

    good = {"nsqd_tcp_addresses": ["127.0.0.1:4150"]}
    Consumer("t", "c", h, **good)  # valid configuration constructs (no I/O yet)
    Consumer("t", "c#ephemeral", h, lookupd_http_addresses=["http://127.0.0.1:4161"])
    with pytest.raises(InvalidArgument):
        Consumer("t", "c", h)
    with pytest.raises(InvalidArgument):
        Consumer("t", "c", h, max_in_flight=-1, **good)
    with pytest.raises(InvalidArgument):
        Consumer("t", "c", h, nsqd_tcp_addresses=["127.0.0.1:notaport"])
    with pytest.raises(InvalidArgument):
        Consumer("t", "c", h, nsqd_tcp_addresses=["127.0.0.1:70000"])
    with pytest.raises(InvalidTopic):
        Consumer("bad topic!", "c", h, **good)
    with pytest.raises(InvalidTopic):
        Consumer("t" * 65, "c", h, **good)
    with pytest.raises(InvalidChannel):
        Consumer("t", "bad/channel", h, **good)
    with pytest.raises(InvalidChannel):
        Consumer("t", "", h, **good)
    with pytest.raises(TypeError):
        Consumer("t", "c", h, max_inflight=3, **good)  # type: ignore[call-arg]


# --------------------------------------------------------------------------- 11. pull mode


async def test_pull_mode_auto_fins(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("pull"), "c"
    create_channel(nsqd.http, topic, ch)
    expected = bodies_for("m", 20)
    await publish(nsqd.tcp, topic, expected)
    pulled: list[Any] = []
    async with Consumer(topic, ch, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=5) as consumer:
        with anyio.fail_after(15):
            async for message in consumer:
                if pulled:
                    assert pulled[-1].has_responded, "previous message not FINed on next pull"
                assert not message.has_responded
                pulled.append(message)
                if len(pulled) == len(expected):
                    message.finish()  # the body answers the last one itself
                    break
        await wait_until(
            lambda: drained(nsqd.http, topic, ch),
            5,
            "all pulled messages FINed",
            describe=lambda: summary(nsqd.http, topic, ch),
        )
        cl = only_client(nsqd.http, topic, ch)
        assert cl is not None and cl["finish_count"] == len(pulled), cl
        s = chan(nsqd.http, topic, ch)
        assert s["requeue_count"] == 0 and s["timeout_count"] == 0, s
        assert consumer.stats().finished == len(pulled)
    assert sorted(m.body for m in pulled) == sorted(expected)
    assert all(m.has_responded for m in pulled)


async def test_pull_mode_break_then_exit_finishes_the_last_message(classic_cluster, anyio_backend):
    """The loop body completed the last message and left with ``break``: leaving the
    ``async with`` normally must FIN it (not REQ it): nothing is redelivered."""
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("pullbreak"), "c"
    create_channel(nsqd.http, topic, ch)
    expected = bodies_for("m", 5)
    await publish(nsqd.tcp, topic, expected)
    pulled: list[Any] = []
    with anyio.fail_after(15):
        async with Consumer(topic, ch, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=5) as c:
            async for message in c:
                pulled.append(message)
                if len(pulled) == len(expected):
                    break
    assert sorted(m.body for m in pulled) == sorted(expected)
    await wait_until(lambda: not clients(nsqd.http, topic, ch), 5, "the consumer to disconnect")
    s = summary(nsqd.http, topic, ch)
    # Messages 1..4 were auto-FINed by the next pull; the 5th was answered one way or the
    # other at exit. Nothing may be left in flight (that would wait for msg_timeout).
    assert s["in_flight_count"] == 0, (
        f"pulled messages left unanswered in flight after the consumer closed; nsqd: {s}"
    )
    assert s["requeue_count"] == 0 and s["depth"] == 0, (
        f"the last pulled message must be FINed (not REQed) after 'break'; nsqd: {s}"
    )


# --------------------------------------------------------------------------- 12. pause


async def test_set_max_in_flight_zero_pauses(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("pause"), "c"
    create_channel(nsqd.http, topic, ch)
    got: list[bytes] = []

    async def handler(message):
        got.append(message.body)

    async with Consumer(topic, ch, handler, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=3) as c:
        await wait_until(lambda: ready_count(nsqd.http, topic, ch) == 3, 10, "RDY 3")
        await publish(nsqd.tcp, topic, bodies_for("a", 5))
        await wait_until(lambda: len(got) == 5, 10, "first 5 handled")
        await wait_until(lambda: drained(nsqd.http, topic, ch), 5, "first 5 FINed")
        c.set_max_in_flight(0)
        await wait_until(lambda: ready_count(nsqd.http, topic, ch) == 0, 5, "RDY 0 (paused)")
        received = c.stats().received
        await publish(nsqd.tcp, topic, bodies_for("b", 5))
        # With RDY 0 confirmed before publishing, nsqd keeps them in the channel.
        await wait_until(
            lambda: chan(nsqd.http, topic, ch).get("depth") == 5, 5, "5 messages waiting"
        )
        s = chan(nsqd.http, topic, ch)
        assert s["in_flight_count"] == 0, s
        assert len(got) == 5 and c.stats().received == received
        c.set_max_in_flight(3)
        await wait_until(lambda: ready_count(nsqd.http, topic, ch) == 3, 5, "RDY 3 (resumed)")
        await wait_until(lambda: len(got) == 10, 10, "the 5 paused messages handled")
        await wait_until(lambda: drained(nsqd.http, topic, ch), 5, "channel drained")
    assert sorted(got) == sorted(bodies_for("a", 5) + bodies_for("b", 5))


# ------------------------------------------------------------- discovery and write details


@asyncio_only
async def test_nsqd_no_lookupd_lists_any_more_is_disconnected(cluster_factory, anyio_backend):
    cluster = cluster_factory("classic", nsqd=2)
    topic, ch = unique("gone"), "c"
    await fill_every_nsqd(cluster, topic, ch, 10)
    got: set[bytes] = set()
    lookupd = cluster.lookupd[0].http
    async with Consumer(
        topic,
        ch,
        lambda m: got.add(m.body),
        lookupd_http_addresses=[lookupd],
        lookupd_poll_interval=0.3,
        lookupd_poll_jitter=0.1,
    ) as c:
        await wait_until(lambda: c.stats().connections == 2, 10, "2 connections")
        gone = cluster.nsqd[1]
        # nsqlookupd leaves a tombstoned producer out of every lookup of the topic
        http_json(
            f"http://{lookupd}/topic/tombstone?topic={topic}&node={gone.http}",
            method="POST",
        )
        await wait_until(lambda: c.stats().connections == 1, 10, "the unlisted nsqd dropped")
        await wait_until(
            lambda: not chan(gone.http, topic, ch).get("clients"), 10, "no client left on it"
        )
        assert chan(cluster.nsqd[0].http, topic, ch).get("clients")


@asyncio_only
async def test_a_dropped_connection_requeries_lookupd_at_once(cluster_factory, anyio_backend):
    cluster = cluster_factory("classic", nsqd=2)
    topic, ch = unique("requery"), "c"
    first, later = cluster.nsqd
    create_channel(first.http, topic, ch)
    got: set[bytes] = set()
    async with Consumer(
        topic,
        ch,
        lambda m: got.add(m.body),
        lookupd_http_addresses=[cluster.lookupd[0].http],
        lookupd_poll_interval=300,  # the regular poll never comes during this test
        reconnect_min=5,
    ) as c:
        await wait_until(lambda: c.stats().connections == 1, 10, "1 connection")
        create_channel(later.http, topic, ch)  # the topic appears on a second nsqd
        bodies = bodies_for("later", 5)
        await publish(later.tcp, topic, bodies)
        cluster.kill_nsqd(0, signal=signal.SIGKILL)
        # only a lookup made because the connection dropped can find the second nsqd now
        await wait_until(lambda: set(bodies) <= got, 15, "messages from the nsqd found by re-query")


async def test_reconnects_back_off_exponentially_with_a_cap_and_log_once(anyio_backend, caplog):
    down = f"127.0.0.1:{free_port()}"  # nothing listens there
    caplog.set_level(logging.DEBUG, logger="smartnsq.consumer")

    def attempts() -> list[logging.LogRecord]:
        return [r for r in caplog.records if down in r.getMessage() and "attempt" in r.getMessage()]

    # delay before attempt k+1: min(0.3, 0.02 * 2**k) * uniform(0.5, 1)
    async with Consumer(
        "t", "c", lambda m: None, nsqd_tcp_addresses=[down], reconnect_min=0.02, reconnect_max=0.3
    ):
        await wait_until(lambda: len(attempts()) >= 12, 20, "12 failed connection attempts")
    records = attempts()[:12]
    gaps = [b.created - a.created for a, b in pairwise(records)]
    assert min(gaps[:2]) < 0.12, gaps  # starts small: 0.01-0.08 s (plus the failed connect)
    assert gaps[-1] >= 0.14, gaps  # and grows to the cap's 0.15-0.3 s
    assert max(gaps) < 1.2, gaps  # uncapped, the 7th wait alone would be 1.28-2.56 s
    capped = gaps[4:]  # 7 waits of 0.3 s x uniform(0.5, 1): jitter spreads them out
    assert max(capped) - min(capped) > 0.01, capped
    levels = [r.levelno for r in records]
    assert levels[0] == logging.WARNING
    assert set(levels[1:]) == {logging.DEBUG}


@asyncio_only
async def test_fins_of_one_read_go_out_in_one_write(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("fins"), "c"
    create_channel(nsqd.http, topic, ch)
    n = 2000
    await publish(nsqd.tcp, topic, bodies_for("f", n))
    await wait_until(lambda: chan(nsqd.http, topic, ch).get("depth") == n, 10, f"{n} queued")
    writes = 0
    handled = 0

    def handler(message: Any) -> None:
        nonlocal handled
        handled += 1

    async with Consumer(topic, ch, handler, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=2500) as c:
        await wait_until(lambda: c.stats().connections == 1, 10, "connected")
        # count what reaches the socket transport from here on (SUB and the first RDY are out)
        (reader,) = c._state.subs.values()
        transport = reader.conn._link._transport
        write = transport.write

        def counting_write(data: bytes) -> None:
            nonlocal writes
            writes += 1
            write(data)

        transport.write = counting_write
        await wait_until(lambda: drained(nsqd.http, topic, ch), 20, "all finished")
    assert handled == n
    assert chan(nsqd.http, topic, ch)["message_count"] == n
    assert writes <= n // 10, f"{writes} writes for {n} FINs"


@asyncio_only
async def test_producers_are_the_union_of_every_lookupd_answer(cluster_factory, anyio_backend):
    cluster = cluster_factory("classic", nsqd=2, lookupd=2)
    topic, ch = unique("union"), "c"
    expected = await fill_every_nsqd(cluster, topic, ch, 20)
    l0, l1 = (d.http for d in cluster.lookupd)
    n0, n1 = cluster.nsqd
    for lookupd in (l0, l1):
        await wait_until(
            lambda lookupd=lookupd: len(listed_producers(lookupd, topic)) == 2,
            10,
            f"both nsqd registered with {lookupd}",
        )
    # each lookupd now tells about one nsqd only: l0 about n0, l1 about n1
    http_json(f"http://{l0}/topic/tombstone?topic={topic}&node={n1.http}", method="POST")
    http_json(f"http://{l1}/topic/tombstone?topic={topic}&node={n0.http}", method="POST")
    for lookupd, left in ((l0, n0), (l1, n1)):
        producers = http_json(f"http://{lookupd}/lookup?topic={topic}")["producers"]
        assert [p["http_port"] for p in producers] == [int(left.http.rsplit(":", 1)[1])]
    got: set[bytes] = set()
    async with Consumer(
        topic, ch, lambda m: got.add(m.body), lookupd_http_addresses=[l0, l1], max_in_flight=10
    ) as c:
        await wait_until(lambda: c.stats().connections == 2, 10, "connections to both nsqd")
        await wait_until(lambda: got == set(expected), 20, "every message from both nsqd")


@asyncio_only
async def test_stats_count_what_nsqd_accepted(classic_cluster, anyio_backend):
    """A FIN or REQ nsqd refuses (the message had timed out) is counted as refused, not as
    finished or requeued."""
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("refused"), "c"
    create_channel(nsqd.http, topic, ch)
    held: list[Any] = []
    again: list[Any] = []

    async def handler(message):
        if message.attempts == 1:
            message.disable_auto_response()
            held.append(message)
        else:
            again.append(message)

    async with Consumer(
        topic, ch, handler, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=2, msg_timeout=1
    ) as c:
        await publish(nsqd.tcp, topic, [b"a", b"b"])
        await wait_until(lambda: len(held) == 2, 10, "both delivered")
        c.set_max_in_flight(0)
        await wait_until(
            lambda: (s := chan(nsqd.http, topic, ch)) and s["timeout_count"] == 2, 10, "timeouts"
        )
        held[0].finish()
        held[1].requeue(0)
        await wait_until(lambda: c.stats().refused == 2, 10, "nsqd's refusals")
        stats = c.stats()
        assert (stats.finished, stats.requeued) == (0, 0)
        c.set_max_in_flight(2)
        await wait_until(lambda: drained(nsqd.http, topic, ch), 10, "the redeliveries finished")
        assert len(again) == 2
        stats = c.stats()
        assert (stats.finished, stats.requeued, stats.refused) == (2, 0, 2)


# A steady stream with a few failures: every backoff window must end and RDY come back.
# The fault campaign found the consumer stuck at RDY 0 with ~1,100 messages waiting.

STREAM = 2000  # bodies published at about 200/s
BAD_EVERY = 20  # 5 % of them fail every time


def _stream_bodies() -> list[bytes]:
    return [b"%d" % i for i in range(STREAM)]


def _bad(body: bytes) -> bool:
    return int(body) % BAD_EVERY == 0


async def _publish_stream(tcp: str, topic: str) -> None:
    bodies = _stream_bodies()
    async with Producer([tcp]) as producer:
        for i in range(0, STREAM, 20):
            await producer.publish_many(topic, bodies[i : i + 20])
            await anyio.sleep(0.1)


STREAM_OPTIONS: dict[str, Any] = {
    "max_in_flight": 50,
    "max_attempts": 2,
    "requeue_delay": 0.2,
    "backoff_unit": 0.1,
    "max_backoff_duration": 1,
}


@asyncio_only
async def test_backoff_windows_during_a_stream_end_and_restore_rdy(classic_cluster, anyio_backend):
    """nsqd hands requeued messages out ahead of the backlog: when their failing again
    counted, every probe failed and the consumer crawled at one message per window."""
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("stream"), "c"
    create_channel(nsqd.http, topic, ch)
    good = {b for b in _stream_bodies() if not _bad(b)}
    handled: set[bytes] = set()

    async def handler(message):
        if _bad(message.body):
            raise RuntimeError("simulated failure")
        handled.add(message.body)

    async with Consumer(topic, ch, handler, nsqd_tcp_addresses=[nsqd.tcp], **STREAM_OPTIONS) as c:
        await _publish_stream(nsqd.tcp, topic)
        await wait_until(
            lambda: handled >= good,
            30,
            "every good message handled",
            lambda: (len(handled), summary(nsqd.http, topic, ch), c.stats()),
        )
        # Idle, a backoff may wait at RDY 1 for a message to decide it: a good one ends it.
        # One at a time, as a stream goes on: those handled during a window decide nothing.
        for i in range(1, 41):
            if ready_count(nsqd.http, topic, ch) == 50 and c.stats().backoff_level == 0:
                break
            await publish(nsqd.tcp, topic, [b"%d" % i])
            await anyio.sleep(0.25)  # the stream's pace, not a wait for a condition
        else:
            raise AssertionError(f"not RDY 50 again: {summary(nsqd.http, topic, ch)} {c.stats()}")


def test_backoff_windows_during_a_stream_end_for_the_blocking_consumer(classic_cluster):
    """The same stream through the blocking consumer and a ``def`` handler."""
    from smartnsq import sync as nsq_sync

    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("stream"), "c"
    create_channel(nsqd.http, topic, ch)
    good = {b for b in _stream_bodies() if not _bad(b)}
    handled: set[bytes] = set()

    def handler(message):
        if _bad(message.body):
            raise RuntimeError("simulated failure")
        handled.add(message.body)

    bodies = _stream_bodies()
    consumer = nsq_sync.Consumer(
        topic, ch, handler, nsqd_tcp_addresses=[nsqd.tcp], **STREAM_OPTIONS
    )
    with consumer, nsq_sync.Producer([nsqd.tcp]) as producer:
        for i in range(0, STREAM, 20):
            producer.publish_many(topic, bodies[i : i + 20])
            time.sleep(0.1)  # the publishing rate, not a wait for a condition
        wait_for(
            lambda: handled >= good,
            30,
            "every good message handled",
        )
        # Idle, a backoff may wait at RDY 1 for a message to decide it: a good one ends it.
        # One at a time, as a stream goes on: those handled during a window decide nothing.
        for i in range(1, 41):
            if ready_count(nsqd.http, topic, ch) == 50 and consumer.stats().backoff_level == 0:
                break
            producer.publish(topic, b"%d" % i)
            time.sleep(0.25)  # the stream's pace, not a wait for a condition
        else:
            state = (summary(nsqd.http, topic, ch), consumer.stats())
            raise AssertionError(f"not RDY 50 again: {state}")


@asyncio_only
async def test_a_lookupd_that_lists_nothing_yet_keeps_working_connections(
    classic_cluster, anyio_backend
):
    """A lookupd just restarted lists no nsqd until they register again: the consumer
    disconnected from every nsqd it had (24 s without messages in the fault campaign)."""
    from tests.helpers import fake_api, json_body

    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("relisted"), "c"
    create_channel(nsqd.http, topic, ch)
    host, port = nsqd.tcp.rsplit(":", 1)
    http_port = int(nsqd.http.rsplit(":", 1)[1])
    listed = json_body(
        {"producers": [{"broadcast_address": host, "tcp_port": int(port), "http_port": http_port}]}
    )
    handled: list[bytes] = []

    async def handler(message):
        handled.append(message.body)

    async with fake_api() as lookupd:
        lookupd.routes["/lookup"] = listed
        async with Consumer(
            topic, ch, handler, lookupd_http_addresses=[lookupd.url], lookupd_poll_interval=0.2
        ) as c:
            await wait_until(lambda: c.stats().connections == 1, 10, "connected through lookupd")
            lookupd.routes["/lookup"] = json_body({"producers": []})  # restarted: empty
            polls = len(lookupd.calls("/lookup"))
            await wait_until(lambda: len(lookupd.calls("/lookup")) >= polls + 3, 10, "polls")
            await publish(nsqd.tcp, topic, [b"still here"])
            await wait_until(lambda: handled == [b"still here"], 10, "the message handled")
            assert c.stats().connections == 1
