"""Producer against a real classic nsqd (v1.3.x) started by compat/."""

from __future__ import annotations

import logging
import signal
import ssl
import threading
from collections.abc import Iterator

import anyio
import pytest
import trustme

from smartnsq import Connection, ConnectionConfig, Producer
from smartnsq.errors import (
    AuthFailed,
    ConnectFailed,
    InvalidArgument,
    InvalidTopic,
    InvalidType,
    MessageTooLarge,
    NoNsqdAvailable,
    NSQError,
    NSQTimeout,
    OutcomeUnknown,
)
from smartnsq.protocol import commands
from tests.helpers import (
    EVERY_LOOP,
    channel_stats,
    create_channel,
    drain,
    http_json,
    lookupds,
    serve_auth,
    start_tls_cluster,
    topic_stats,
    unique,
    wait_for,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def test_pub_mpub_arrive(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("pub")
    async with Producer([nsqd.tcp]) as producer:
        await producer.publish(topic, b"one")
        await producer.publish_many(topic, [b"two", b"three", b"four"])
    stats = wait_for(lambda: topic_stats(nsqd.http, topic), what="topic stats")
    assert stats["message_count"] == 4
    got = await drain(nsqd.tcp, topic, "c", 4)
    assert sorted(m.body for m in got) == [b"four", b"one", b"three", b"two"]


async def test_mpub_splits_batches_over_the_body_limit(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("split")
    bodies = [bytes([65 + i % 26]) * 1000 for i in range(50)]
    # max_body_size 10 KiB forces 50 x 1 KB into 6 MPUBs; order is kept across them.
    async with Producer([nsqd.tcp], max_message_size=2000, max_body_size=10_240) as producer:
        await producer.publish_many(topic, bodies)
    got = await drain(nsqd.tcp, topic, "c", 50)
    assert sorted(m.body for m in got) == sorted(bodies)
    assert topic_stats(nsqd.http, topic)["message_count"] == 50


async def test_dpub_is_deferred(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("dpub")
    create_channel(nsqd.http, topic, "c")
    async with Producer([nsqd.tcp]) as producer:
        await producer.publish(topic, b"later", delay=1.5)
    stats = channel_stats(nsqd.http, topic, "c")
    assert stats is not None
    assert stats["deferred_count"] == 1 and stats["depth"] == 0
    wait_for(
        lambda: channel_stats(nsqd.http, topic, "c")["depth"] == 1,  # type: ignore[index]
        timeout=10,
        what="deferred message to become ready",
    )
    assert channel_stats(nsqd.http, topic, "c")["deferred_count"] == 0  # type: ignore[index]


async def test_bad_input_raises_before_sending(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("bad")
    async with Producer([nsqd.tcp], max_message_size=100) as producer:
        with pytest.raises(InvalidArgument, match="empty"):
            await producer.publish(topic, b"")
        with pytest.raises(InvalidType, match="encode it first"):
            await producer.publish(topic, "text")  # type: ignore[arg-type]
        with pytest.raises(InvalidTopic):
            await producer.publish("bad topic", b"x")
        with pytest.raises(MessageTooLarge, match="max_message_size"):
            await producer.publish(topic, b"x" * 101)
        with pytest.raises(MessageTooLarge):
            await producer.publish_many(topic, [b"ok", b"x" * 101])
        with pytest.raises(InvalidArgument, match="at least one"):
            await producer.publish_many(topic, [])
        with pytest.raises(InvalidArgument, match="delay"):
            await producer.publish(topic, b"x", delay=-1)
    assert topic_stats(nsqd.http, topic) is None  # nothing reached the server


def test_bad_configuration():
    with pytest.raises(InvalidArgument, match="nsqd_tcp_addresses or lookupd_http_addresses"):
        Producer([])
    with pytest.raises(InvalidArgument, match="non-numeric port"):
        Producer(["nohost:"])
    with pytest.raises(InvalidArgument, match="snappy or deflate"):
        Producer(["127.0.0.1:4150"], snappy=True, deflate=True)


@EVERY_LOOP
async def test_server_rejects_oversized_message_without_retry(cluster_factory, anyio_backend):
    cluster = cluster_factory("classic", nsqd_args=["--max-msg-size=500"])
    nsqd = cluster.nsqd[0]
    async with Producer([nsqd.tcp], max_retries=0) as producer:
        with pytest.raises(NSQError, match="E_BAD_MESSAGE"):
            await producer.publish("big", b"x" * 600)
        await producer.publish("big", b"fits")  # a fresh connection replaces the closed one
    assert topic_stats(nsqd.http, "big")["message_count"] == 1  # type: ignore[index]


@EVERY_LOOP
async def test_fatal_error_marks_the_connection_unusable_before_the_caller_resumes(
    cluster_factory, anyio_backend
):
    cluster = cluster_factory("classic", nsqd_args=["--max-msg-size=500"])
    conn = await Connection.open(cluster.nsqd[0].tcp)
    async with anyio.create_task_group() as tg:
        tg.start_soon(conn.run)
        with pytest.raises(NSQError, match="E_BAD_MESSAGE"):
            await conn.request(commands.pub("big", b"x" * 600), publish=True)
        # nsqd closes the connection after a fatal error; the caller must not be able to
        # send another request on it (answers are woken only after the whole read).
        assert not conn.usable
        await conn.close()


@EVERY_LOOP
async def test_pipelined_concurrent_publish(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("conc")
    async with Producer([nsqd.tcp]) as producer:

        async def worker(w: int) -> None:
            for i in range(50):
                await producer.publish(topic, f"{w}-{i}".encode())

        async with anyio.create_task_group() as tg:
            for w in range(20):
                tg.start_soon(worker, w)
    got = await drain(nsqd.tcp, topic, "c", 1000)
    assert len({m.body for m in got}) == 1000


@EVERY_LOOP
@pytest.mark.parametrize("compression", ["snappy", "deflate"])
async def test_compression(classic_cluster, anyio_backend, compression):
    nsqd = classic_cluster.nsqd[0]
    topic = unique(compression)
    config = ConnectionConfig(**{compression: True})
    conn = await Connection.open(nsqd.tcp, config)
    assert getattr(conn.features, compression) is True
    await conn.close()
    body = b"compressible " * 200
    async with Producer([nsqd.tcp], **{compression: True}) as producer:
        for _ in range(20):
            await producer.publish(topic, body)
        await producer.publish_many(topic, [body] * 20)
    assert topic_stats(nsqd.http, topic)["message_count"] == 40  # type: ignore[index]


# -- TLS ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory, tls_ca) -> Iterator[object]:
    cluster = start_tls_cluster(tls_ca, tmp_path_factory.mktemp("tls"))
    try:
        yield cluster
    finally:
        cluster.stop()


@EVERY_LOOP
async def test_tls_publish_with_verification(tls_cluster, tls_ca, anyio_backend):
    nsqd = tls_cluster.nsqd[0]  # type: ignore[attr-defined]
    topic = unique("tls")
    ctx = ssl.create_default_context()
    tls_ca.configure_trust(ctx)
    async with Producer([nsqd.tcp], tls=ctx, snappy=True) as producer:
        await producer.publish(topic, b"secure")
        await producer.publish_many(topic, [b"a", b"b"])
    assert topic_stats(nsqd.http, topic)["message_count"] == 3


async def test_tls_rejects_an_untrusted_certificate(tls_cluster, anyio_backend):
    nsqd = tls_cluster.nsqd[0]  # type: ignore[attr-defined]
    # Default context: the test CA is not trusted, so verification must fail.
    with pytest.raises(ConnectFailed):
        await Connection.open(nsqd.tcp, ConnectionConfig(tls=True))


async def test_tls_required_by_server_without_client_tls_fails(tls_cluster, anyio_backend):
    nsqd = tls_cluster.nsqd[0]  # type: ignore[attr-defined]
    async with Producer([nsqd.tcp], max_retries=0) as producer:
        with pytest.raises(NSQError):
            await producer.publish("plain", b"x")


# -- AUTH -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def auth_server() -> Iterator[str]:
    with serve_auth("good-secret", "auth_.*") as address:
        yield address


async def test_auth(cluster_factory, auth_server, anyio_backend):
    cluster = cluster_factory("classic", nsqd_args=[f"--auth-http-address={auth_server}"])
    nsqd = cluster.nsqd[0]
    async with Producer([nsqd.tcp], auth_secret="good-secret") as producer:
        await producer.publish("auth_ok", b"allowed")
    assert topic_stats(nsqd.http, "auth_ok")["message_count"] == 1  # type: ignore[index]
    conn = await Connection.open(nsqd.tcp, ConnectionConfig(auth_secret="good-secret"))
    assert conn.features.auth_required and conn.auth and conn.auth["identity"] == "tester"
    await conn.close()
    with pytest.raises(AuthFailed):
        await Connection.open(nsqd.tcp, ConnectionConfig(auth_secret="wrong"))
    with pytest.raises(ConnectFailed, match="requires AUTH"):
        await Connection.open(nsqd.tcp, ConnectionConfig())
    async with Producer([nsqd.tcp], auth_secret="good-secret", max_retries=0) as producer:
        with pytest.raises(NSQError, match="E_UNAUTHORIZED"):
            await producer.publish("not_allowed", b"x")


# -- failures -------------------------------------------------------------------------------------


@EVERY_LOOP
async def test_restart_mid_publish_loses_nothing(cluster_factory, anyio_backend):
    """Every publish either succeeded or raised, and every success is in the topic."""
    cluster = cluster_factory("classic")
    nsqd = cluster.nsqd[0]
    topic = unique("restart")
    create_channel(nsqd.http, topic, "c")
    ok: list[bytes] = []
    failed: list[bytes] = []
    restarted = anyio.Event()

    async with Producer([nsqd.tcp], timeout=5, max_retries=2, retry_backoff=0.05) as producer:

        async def worker(w: int) -> None:
            i = 0
            while not restarted.is_set() or i < 300:
                body = f"{w}-{i}".encode()
                i += 1
                try:
                    await producer.publish(topic, body)
                    ok.append(body)
                except NSQError:
                    failed.append(body)
                    await anyio.sleep(0.01)

        async with anyio.create_task_group() as tg:
            for w in range(8):
                tg.start_soon(worker, w)
            with anyio.fail_after(30):
                while len(ok) < 500:
                    await anyio.sleep(0.01)
            # A graceful restart: nsqd persists its in-memory queue on SIGTERM.
            await anyio.to_thread.run_sync(
                lambda: (cluster.kill_nsqd(0, signal.SIGTERM), cluster.restart_nsqd(0))
            )
            restarted.set()

    # A publish in flight when nsqd went down raises OutcomeUnknown (not sent again).
    assert len(ok) + len(failed) >= 8 * 300 and len(ok) > 8 * 250
    # A body that raised may still be stored: read until every acknowledged body is seen
    # (or time out and report what is missing).
    wanted = set(ok)
    received: set[bytes] = set()

    def seen_all(got: list) -> bool:
        received.add(got[-1].body)
        return wanted <= received

    try:
        await drain(nsqd.tcp, topic, "c", 2500, timeout=30, until=seen_all)
    except TimeoutError:
        pass
    missing = wanted - received
    assert not missing, f"{len(missing)} acknowledged messages are missing"


async def test_failover_to_another_nsqd(cluster_factory, anyio_backend):
    cluster = cluster_factory("classic", nsqd=2)
    a, b = cluster.nsqd
    topic = unique("failover")
    async with Producer([a.tcp, b.tcp], timeout=10) as producer:
        for i in range(10):
            await producer.publish(topic, b"before %d" % i)
        await anyio.to_thread.run_sync(lambda: cluster.kill_nsqd(0))
        unknown = 0
        for i in range(50):
            try:
                await producer.publish(topic, b"after %d" % i)
            except OutcomeUnknown:
                # Written before the producer read the dead nsqd's end of stream: it may
                # have been stored, so it is not sent again. Only the first can be.
                assert i == 0
                unknown += 1
    assert topic_stats(b.http, topic)["message_count"] >= 50 - unknown  # type: ignore[index]


async def test_unreachable_nsqd_raises(anyio_backend):
    async with Producer(["127.0.0.1:1"], timeout=2, max_retries=1) as producer:
        with pytest.raises(NSQError, match=r"127\.0\.0\.1:1\b"):
            await producer.publish("t", b"x")


async def test_a_failed_later_batch_reports_how_many_were_published(cluster_factory, anyio_backend):
    from smartnsq.errors import PartialPublish

    cluster = cluster_factory("classic", nsqd_args=["--max-msg-size=500"])
    nsqd = cluster.nsqd[0]
    topic = unique("partial")
    bodies = [b"s" * 100] * 5 + [b"B" * 600]  # the last batch is over nsqd's limit
    async with Producer(
        [nsqd.tcp], max_message_size=1000, max_body_size=1024, max_retries=0
    ) as producer:
        with pytest.raises(PartialPublish, match="published 5 of 6") as info:
            await producer.publish_many(topic, bodies)
        assert info.value.published == 5 and info.value.__cause__ is not None
    assert topic_stats(nsqd.http, topic)["message_count"] == 5


def stored(cluster: object, topic: str) -> int:
    """Messages of ``topic`` over every nsqd of a compat cluster."""
    return sum(
        int((topic_stats(d.http, topic) or {}).get("message_count") or 0)
        for d in cluster.nsqd  # type: ignore[attr-defined]
    )


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_lookupd_only_producer_publishes_to_a_topic_that_does_not_exist_yet(
    cluster_factory, anyio_backend
):
    # nsqd creates a topic on its first PUB: with lookupd only, the producer picks among the
    # nsqd lookupd knows, as it would with their addresses.
    cluster = cluster_factory("classic", nsqd=2)
    first, second = unique("fresh"), unique("fresh")
    async with Producer(lookupd_http_addresses=lookupds(cluster), timeout=5) as producer:
        await producer.publish(first, b"one")
        await producer.publish_many(second, [b"a", b"b"])
        assert await producer.is_ext_topic(unique("fresh")) is False
        for i in range(10):  # then as usual, once lookupd lists it
            await producer.publish(first, b"more %d" % i)
    assert stored(cluster, first) == 11
    assert stored(cluster, second) == 2


def test_the_blocking_producer_publishes_to_a_topic_that_does_not_exist_yet(cluster_factory):
    from smartnsq import sync as nsq_sync

    cluster = cluster_factory("classic", nsqd=2)
    topic = unique("fresh")
    with nsq_sync.Producer(lookupd_http_addresses=lookupds(cluster), timeout=5) as producer:
        producer.publish(topic, b"one")
        producer.publish_many(topic, [b"a", b"b"])
    assert stored(cluster, topic) == 3


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_new_topic_fails_over_from_an_nsqd_lookupd_still_lists(
    cluster_factory, anyio_backend
):
    cluster = cluster_factory("classic", nsqd=2)
    # lookupd may list its nsqd in the same order every time, and ties go by that order:
    # stop the one it lists first, so that it is tried whatever the order
    listed = http_json(f"http://{cluster.lookupd[0].http}/nodes")["producers"]
    first = listed[0]["tcp_port"]
    stopped = next(d for d in cluster.nsqd if d.tcp.endswith(f":{first}"))
    stopped.signal(signal.SIGSTOP)  # still registered with lookupd, answers nothing
    try:
        async with Producer(lookupd_http_addresses=lookupds(cluster), timeout=10) as producer:
            topics: list[str] = []
            # lookupd lists its nsqd in no set order: publish until the stopped one was tried
            while not producer.stats().nodes.get(stopped.tcp, None) or len(topics) < 4:
                assert len(topics) < 30, "the stopped nsqd was never tried"
                topics.append(unique("fresh"))
                await producer.publish(topics[-1], b"x")
            assert producer.stats().nodes[stopped.tcp].errors >= 1
    finally:
        stopped.signal(signal.SIGCONT)
    assert [stored(cluster, t) for t in topics] == [1] * len(topics)


async def test_tasks_sharing_a_producer_keep_their_timeout_and_never_resend(
    cluster_factory, anyio_backend
):
    """8 tasks share one Producer(timeout=2); nsqd is stopped (SIGSTOP) for 3 s under their
    publishes: each raises NSQTimeout within its timeout, and nothing is sent twice (the
    blocking Producer's twin: tests/sync/test_producer.py)."""
    import os
    import time

    nsqd = cluster_factory("classic", nsqd=1).nsqd[0]
    topic = unique("astop")
    took: list[float] = []
    outcomes: list[object] = []
    async with Producer([nsqd.tcp], timeout=2) as producer:
        await producer.publish(topic, b"warm")

        async def work(t: int) -> None:
            started = time.monotonic()
            try:
                await producer.publish(topic, b"body %d" % t)
                outcomes.append("ok")
            except NSQError as exc:
                outcomes.append(exc)
            took.append(time.monotonic() - started)

        resume = threading.Timer(3.0, os.kill, (nsqd.pid, signal.SIGCONT))
        os.kill(nsqd.pid, signal.SIGSTOP)
        resume.start()
        try:
            async with anyio.create_task_group() as tg:
                for t in range(8):
                    tg.start_soon(work, t)
        finally:
            await anyio.to_thread.run_sync(resume.join)
            os.kill(nsqd.pid, signal.SIGCONT)
    assert max(took) < 2 + 0.5, (took, outcomes)
    assert all(isinstance(o, NSQTimeout) for o in outcomes), outcomes
    await wait_until(lambda: not nsqd_producers(nsqd.http), what="nsqd done with every connection")
    count = int(topic_stats(nsqd.http, topic)["message_count"])
    bodies = [m.body for m in await drain(nsqd.tcp, topic, "check", count)]
    assert b"warm" in bodies and len(bodies) == len(set(bodies)) == count <= 9, bodies


def nsqd_producers(nsqd_http: str) -> list[object]:
    return list(http_json(f"http://{nsqd_http}/stats?format=json").get("producers") or [])


async def test_settings_nsqd_refuses_fail_the_start_and_are_never_retried(
    cluster_factory, auth_server, anyio_backend, caplog
):
    """nsqd's --max-heartbeat-interval is 10 s here: 30 s is refused at IDENTIFY. Before:
    the Producer entered, and each publish raised the bare BadBody."""
    from smartnsq.errors import BadBody, ConfigRefused

    nsqd = cluster_factory("classic", nsqd_args=["--max-heartbeat-interval=10s"]).nsqd[0]
    producer = Producer([nsqd.tcp], heartbeat_interval=30)
    with anyio.fail_after(5), pytest.raises(ConfigRefused, match="heartbeat") as info:
        async with producer:
            pytest.fail("entered")
    assert isinstance(info.value.__cause__, BadBody)
    assert "--max-heartbeat-interval" in str(info.value)  # what to change
    async with Producer([nsqd.tcp], heartbeat_interval=10) as producer:
        await producer.publish(unique("hb"), b"ok")

    # Refused after it was accepted (nsqd restarted with an auth server): said once, loudly,
    # and each publish raises at once, without retries.
    cluster = cluster_factory("classic", nsqd=1)
    nsqd = cluster.nsqd[0]
    topic = unique("later")
    caplog.set_level(logging.DEBUG, "smartnsq")
    async with Producer([nsqd.tcp], max_retries=3) as producer:
        await producer.publish(topic, b"before")
        await anyio.to_thread.run_sync(cluster.kill_nsqd, 0, signal.SIGTERM)
        nsqd.argv.append(f"--auth-http-address={auth_server}")
        await anyio.to_thread.run_sync(cluster.restart_nsqd, 0)
        for _ in range(3):
            with anyio.fail_after(5), pytest.raises(ConfigRefused, match="auth_secret"):
                await producer.publish(topic, b"after")
        assert producer.stats().retried == 0
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and "smartnsq" in r.name]
    assert len(errors) == 1 and "took these settings before" in errors[0].getMessage()


async def test_an_nsqd_that_never_handshakes_is_a_failed_connect(cluster_factory, anyio_backend):
    """Two nsqd, the first stopped (SIGSTOP: the kernel accepts the connection, nsqd never
    answers the handshake). Its handshake is bounded by ``connect_timeout`` and counts as a
    failed connect (nothing was sent): each publish fails over to the other nsqd within its
    ``timeout``. Before: the handshake had a fixed 5 s, so with ``timeout=3`` the publish
    raised NSQTimeout "may or may not have been published" (the blocking Producer's twin:
    tests/sync/test_producer.py)."""
    import time

    cluster = cluster_factory("classic", nsqd=2)
    stopped, live = cluster.nsqd
    topic = unique("hsstop")
    took: list[float] = []
    stopped.signal(signal.SIGSTOP)
    try:
        async with Producer(
            [live.tcp, stopped.tcp], timeout=3, connect_timeout=1, max_retries=0
        ) as producer:
            for i in range(4):
                started = time.monotonic()
                await producer.publish(topic, b"m%d" % i)
                took.append(time.monotonic() - started)
            # The start connected to the live one only; publishes take turns, so one tried
            # the stopped nsqd.
            assert producer.stats().nodes[stopped.tcp].errors >= 1
    finally:
        stopped.signal(signal.SIGCONT)
    assert max(took) < 3, took
    assert int(topic_stats(live.http, topic)["message_count"]) == 4


async def test_a_publish_whose_time_ran_out_before_sending_says_it_was_not_sent(
    cluster_factory, anyio_backend
):
    """The only nsqd is stopped before the Producer connects: the call's ``timeout`` (1 s)
    runs out in the handshake (``connect_timeout`` 2 s), before anything was sent. The error
    says it was NOT sent (NoNsqdAvailable), not "may or may not have been published"."""
    import time

    nsqd = cluster_factory("classic", nsqd=1).nsqd[0]
    nsqd.signal(signal.SIGSTOP)
    try:
        async with Producer([nsqd.tcp], timeout=1, connect_timeout=2) as producer:
            started = time.monotonic()
            with pytest.raises(NoNsqdAvailable, match="not sent") as caught:
                await producer.publish(unique("hsstop"), b"x")
            took = time.monotonic() - started
    finally:
        nsqd.signal(signal.SIGCONT)
    assert "may or may not" not in str(caught.value)
    assert took < 1 + 0.5, took


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_topic_whose_every_nsqd_is_down_goes_to_another_nsqd(
    cluster_factory, anyio_backend
):
    """A lookupd-only Producer; the topic exists on one nsqd only, which is stopped (lookupd
    still lists it) while another nsqd lives. Publishes go to the live nsqd, which creates
    the topic (consumers through lookupd find both). Before: every publish raised."""
    cluster = cluster_factory("classic", nsqd=2)
    stopped, live = cluster.nsqd
    topic = unique("orphan")
    create_channel(stopped.http, topic, "c")
    wait_for(
        lambda: (http_json(f"http://{cluster.lookupd[0].http}/lookup?topic={topic}") or {}).get(
            "producers"
        ),
        10,
        "lookupd to list the topic's nsqd",
    )
    stopped.signal(signal.SIGSTOP)
    try:
        async with Producer(
            lookupd_http_addresses=lookupds(cluster), timeout=3, connect_timeout=1
        ) as producer:
            for i in range(3):
                await producer.publish(topic, b"m%d" % i)
    finally:
        stopped.signal(signal.SIGCONT)
    assert int(topic_stats(live.http, topic)["message_count"]) == 3


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_new_topic_waits_for_a_restarted_lookupd_to_list_its_nsqd(
    cluster_factory, anyio_backend
):
    """A lookupd just restarted lists no nsqd until they register again (nsqd's next ping,
    up to 15 s): a publish of a new topic through it raises NoNsqdAvailable, which passes,
    and succeeds once the nsqd is listed again. Before: TopicNotFound, as for a topic that
    must be created first, and to-nsq stopped copying ("destination topic does not exist",
    found by the fault campaign)."""
    from compat.cluster import http_request

    cluster = cluster_factory("classic", nsqd=1)
    lookupd = cluster.lookupd[0]
    lookupd.signal(signal.SIGTERM)
    assert lookupd.wait_exit(15.0)
    lookupd.reap()
    lookupd.spawn()

    def up() -> bool:
        try:
            return http_request(f"http://{lookupd.http}/ping", timeout=1.0)[0] == 200
        except OSError:
            return False

    wait_for(up, 10, "lookupd up")
    nodes = http_json(f"http://{lookupd.http}/nodes") or {}
    assert not nodes.get("producers"), nodes  # the case under test: it lists nothing yet
    topic = unique("relisted")
    async with Producer(lookupd_http_addresses=lookupds(cluster)) as producer:
        with pytest.raises(NoNsqdAvailable, match="lists no nsqd"):
            await producer.publish(topic, b"early")
        # nsqd registers again at its next lookupd ping (15 s), or at once when it has news.
        create_channel(cluster.nsqd[0].http, unique("news"), "c")
        wait_for(
            lambda: (http_json(f"http://{lookupd.http}/nodes") or {}).get("producers"),
            30,
            "the nsqd to register again",
        )
        await producer.publish(topic, b"later")
    assert int(topic_stats(cluster.nsqd[0].http, topic)["message_count"]) == 1
