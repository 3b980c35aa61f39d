"""The blocking Producer against real nsqd: classic and Youzan."""

from __future__ import annotations

import os
import random
import signal
import ssl
import threading
import time

import anyio
import pytest
import trustme

from compat.youzan import create_topic
from smartnsq.errors import (
    InvalidArgument,
    InvalidType,
    MessageTooLarge,
    NotSupported,
    NSQError,
    NSQTimeout,
    OutcomeUnknown,
    PartialPublish,
    UsedAfterFork,
)
from smartnsq.ordered import go_partition
from smartnsq.sync import Producer
from tests.helpers import (
    drain,
    http_json,
    lookupds,
    start_tls_cluster,
    topic_stats,
    unique,
    wait_for,
)

pytestmark = pytest.mark.integration


def stored(nsqd_http: str, topic: str) -> int:
    stats = topic_stats(nsqd_http, topic)
    return 0 if stats is None else int(stats["message_count"])


def test_publish_and_publish_many_arrive(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("spub")
    with Producer([nsqd.tcp]) as producer:
        assert producer.publish(topic, b"one") is None
        assert producer.publish_many(topic, [b"two", bytearray(b"three"), memoryview(b"4")]) is None
        producer.publish(topic, b"later", delay=1)
    assert stored(nsqd.http, topic) == 5


@pytest.mark.parametrize("option", ["snappy", "deflate"])
def test_compression(classic_cluster, option):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("scomp")
    with Producer([nsqd.tcp], **{option: True}) as producer:
        for i in range(20):
            producer.publish(topic, b"compressed %d" % i)
        producer.publish_many(topic, [b"x" * 1000] * 50)
    assert stored(nsqd.http, topic) == 70


def test_bad_input_is_refused_before_sending(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("sbad")
    with Producer([nsqd.tcp], max_message_size=100) as producer:
        with pytest.raises(InvalidType):
            producer.publish(topic, "text")  # type: ignore[arg-type]
        with pytest.raises(MessageTooLarge):
            producer.publish(topic, b"x" * 101)
        with pytest.raises(InvalidArgument):
            producer.publish(topic, b"x", timeout=float("nan"))
        with pytest.raises(InvalidType):
            producer.publish_many(topic, None)  # type: ignore[arg-type]
        with pytest.raises(NotSupported, match="classic nsqd"):
            producer.publish(topic, b"x", partition=1)
    assert topic_stats(nsqd.http, topic) is None  # nothing reached nsqd


def test_sixteen_threads_share_one_producer(classic_cluster):
    """Every publish returns after nsqd's answer or raises; the counts match nsqd's."""
    nsqd = classic_cluster.nsqd[0]
    topic = unique("sthreads")
    ok = [0] * 16
    failed = [0] * 16
    big = [0] * 16

    def work(t: int, producer: Producer) -> None:
        rnd = random.Random(t)
        for i in range(300):
            try:
                if rnd.random() < 0.2:
                    producer.publish_many(topic, [b"t%d-%d-%d" % (t, i, j) for j in range(10)])
                    big[t] += 1
                else:
                    producer.publish(topic, b"t%d-%d" % (t, i))
                    ok[t] += 1
            except NSQError:
                failed[t] += 1

    with Producer([nsqd.tcp]) as producer:
        threads = [threading.Thread(target=work, args=(t, producer)) for t in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert sum(failed) == 0
    assert stored(nsqd.http, topic) == sum(ok) + 10 * sum(big) == 16 * 300 + 9 * sum(big)


def test_a_server_restart_mid_publish_loses_no_acknowledged_message(cluster_factory):
    cluster = cluster_factory("classic", nsqd=1)
    nsqd = cluster.nsqd[0]
    topic = unique("srestart")
    acked = [0] * 4
    stop = threading.Event()

    def work(t: int, producer: Producer) -> None:
        i = 0
        while not stop.is_set():
            try:
                producer.publish(topic, b"%d-%d" % (t, i), timeout=5)
                acked[t] += 1
            except NSQError:
                pass
            i += 1

    with Producer([nsqd.tcp], max_retries=5, retry_backoff=0.1) as producer:
        threads = [threading.Thread(target=work, args=(t, producer)) for t in range(4)]
        for thread in threads:
            thread.start()
        wait_for(lambda: sum(acked) > 200, what="publishing under way")
        cluster.kill_nsqd(0, signal=signal.SIGTERM)  # nsqd writes its queue to disk
        cluster.restart_nsqd(0)
        before = sum(acked)
        wait_for(lambda: sum(acked) > before + 200, timeout=20, what="publishing resumed")
        stop.set()
        for thread in threads:
            thread.join()
    depth = int(topic_stats(nsqd.http, topic)["depth"])
    assert depth >= sum(acked)  # at least once: retries after the restart may duplicate


def test_heartbeats_are_answered_and_an_idle_drop_is_reconnected(classic_cluster):
    """No thread reads while nobody publishes: heartbeats that came meanwhile are answered
    before the next publish, and a connection nsqd dropped for missing two of them is
    replaced without losing or failing a publish."""
    nsqd = classic_cluster.nsqd[0]
    topic = unique("sidle")
    with Producer([nsqd.tcp], heartbeat_interval=1) as producer:
        producer.publish(topic, b"first")
        conn = producer._links.nodes.direct[0].connections[0]
        time.sleep(1.5)  # idle for one heartbeat (the behaviour under test)
        producer.publish(topic, b"second")
        assert producer._links.nodes.direct[0].connections == [conn] and not conn.closed
        time.sleep(3.5)  # idle past two heartbeats: nsqd drops the connection
        producer.publish(topic, b"third")
        assert conn.closed and producer._links.nodes.direct[0].connections[0] is not conn
    assert stored(nsqd.http, topic) == 3


def test_a_mute_server_times_out():
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted: list[socket.socket] = []

    def serve() -> None:
        sock, _ = server.accept()
        accepted.append(sock)
        sock.recv(4096)
        from tests.fakes import IDENTIFY_OK

        sock.sendall(IDENTIFY_OK)

    thread = threading.Thread(target=serve)
    thread.start()
    with Producer([f"127.0.0.1:{port}"], max_retries=0) as producer:
        started = time.monotonic()
        with pytest.raises(NSQTimeout, match="may or may not"):
            producer.publish("t", b"x", timeout=0.5)
        assert time.monotonic() - started < 2
    thread.join()
    for sock in accepted:
        sock.close()
    server.close()


def test_a_large_publish_to_a_slow_reader_is_sent_whole():
    """More bytes than the socket takes at once: the rest goes out as the server reads."""
    import socket
    import struct

    from tests.fakes import accept_identify

    body = bytes(random.getrandbits(8) for _ in range(256)) * (32 * 1024)  # 8 MiB
    command = b"PUB t\n" + struct.pack(">I", len(body)) + body
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    got = bytearray()

    def serve() -> None:
        sock, _ = server.accept()
        with sock:
            got.extend(accept_identify(sock))
            while len(got) < len(command):  # small reads: the client's sends fill up
                got.extend(sock.recv(4096))
            sock.sendall(b"\x00\x00\x00\x06\x00\x00\x00\x00OK")
            sock.recv(1)  # until the client closes

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with Producer(
            [f"127.0.0.1:{port}"], max_message_size=len(body), max_body_size=len(body) + 8
        ) as producer:
            producer.publish("t", body, timeout=30)
    finally:
        thread.join(30)
        server.close()
    assert bytes(got) == command


def test_use_after_fork_is_refused(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("sfork")
    with Producer([nsqd.tcp]) as producer:
        producer.publish(topic, b"parent")
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            try:
                producer.publish(topic, b"child")
                code = b"published"
            except UsedAfterFork:
                code = b"refused"
            except BaseException:
                code = b"other"
            os.write(write, code)
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.read(read, 100) == b"refused"
        producer.publish(topic, b"parent again")
    assert stored(nsqd.http, topic) == 2


def test_tls(tmp_path):
    ca = trustme.CA()
    with start_tls_cluster(ca, tmp_path) as cluster:
        nsqd = cluster.nsqd[0]
        topic = unique("stls")
        ctx = ssl.create_default_context()
        ca.configure_trust(ctx)
        with Producer([nsqd.tcp], tls=ctx, deflate=True) as producer:
            producer.publish(topic, b"secure")
            producer.publish_many(topic, [b"a", b"b"])
        assert stored(nsqd.http, topic) == 3
        untrusted = Producer([nsqd.tcp], tls=True, max_retries=0)
        with untrusted, pytest.raises(NSQError):
            untrusted.publish(topic, b"x")


def test_youzan_routing_by_key_and_traced_results(youzan_cluster):
    topic = f"syz_{random.getrandbits(32):x}"
    create_topic(youzan_cluster, topic, partitions=2, replicas=1, channel="ch")
    with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        for i in range(20):
            key = f"user-{i}"
            result = producer.publish(topic, key.encode(), sharding_key=key, trace_id=i + 1)
            assert result is not None
            assert result.partition == go_partition(key, 2), key
            assert result.trace_id == i + 1
        results = producer.publish_many(topic, [b"a", b"b", b"c"], partition=1, trace_ids=[1, 2, 3])
        assert results is not None and [r.partition for r in results] == [1]
        with pytest.raises(NotSupported, match="DPUB"):
            producer.publish(topic, b"late", delay=1)


def test_a_failed_later_batch_reports_how_many_were_published(cluster_factory):
    cluster = cluster_factory("classic", nsqd_args=["--max-msg-size=500"])
    nsqd = cluster.nsqd[0]
    topic = unique("spartial")
    bodies = [b"s" * 100] * 5 + [b"B" * 600]  # the last batch is over nsqd's limit
    with Producer([nsqd.tcp], max_message_size=1000, max_body_size=1024, max_retries=0) as producer:
        with pytest.raises(PartialPublish, match="published 5 of 6") as info:
            producer.publish_many(topic, bodies)
        assert info.value.__cause__ is not None
        with pytest.raises(NSQError) as first:  # nothing acknowledged: the error itself
            producer.publish_many(topic, [b"B" * 600])
        assert not isinstance(first.value, PartialPublish)
    assert stored(nsqd.http, topic) == 5


def test_a_publish_whose_connection_broke_unanswered_is_not_sent_again():
    """nsqd here closes its first connection after reading the second PUB, without an
    answer: that message may be stored, so it is not sent again (before, it was, on a new
    connection: a possible duplicate); the next publish takes a new connection at once."""
    import socket

    from smartnsq.protocol.frames import FRAME_RESPONSE, encode_frame
    from tests.fakes import accept_identify

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    pubs: list[int] = []  # which connection each PUB arrived on

    def serve() -> None:
        for n in (1, 2):
            sock, _ = server.accept()
            with sock:
                data = accept_identify(sock)
                while True:
                    while b"PUB " not in data:
                        chunk = sock.recv(4096)
                        if not chunk:
                            return
                        data += chunk
                    data = data[data.index(b"PUB ") + 4 :]
                    pubs.append(n)
                    if n == 1 and len(pubs) == 2:
                        break  # the second PUB: close without an answer
                    sock.sendall(encode_frame(FRAME_RESPONSE, b"OK"))
                    if n == 2:
                        return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with Producer([f"127.0.0.1:{port}"], max_retries=3, timeout=5) as producer:
        producer.publish("t", b"first")
        with pytest.raises(OutcomeUnknown, match="may or may not have been published"):
            producer.publish("t", b"second")
        assert producer.stats().retried == 0
        producer.publish("t", b"third")
    thread.join(5)
    server.close()
    assert pubs == [1, 1, 2]


def producer_connections(nsqd_http: str) -> int:
    return len(http_json(f"http://{nsqd_http}/stats?format=json").get("producers") or [])


@pytest.mark.parametrize("stop", [3.0, 6.0])
def test_threads_sharing_a_producer_keep_their_timeout_and_never_resend(cluster_factory, stop):
    """8 threads share one Producer(timeout=2); nsqd is stopped (SIGSTOP) for ``stop``
    seconds under their publishes. Before: 7 of 8 calls raised after 4 s (a retry got a fresh
    timeout), or returned after 3 s having sent their message again (stored twice)."""
    nsqd = cluster_factory("classic", nsqd=1).nsqd[0]
    topic = unique("sstop")
    took: list[float] = [0.0] * 8
    outcomes: list[object] = [None] * 8
    with Producer([nsqd.tcp], timeout=2) as producer:
        producer.publish(topic, b"warm")  # the shared connection is open
        go = threading.Barrier(9)

        def work(t: int) -> None:
            go.wait()
            started = time.monotonic()
            try:
                producer.publish(topic, b"body %d" % t)
                outcomes[t] = "ok"
            except NSQError as exc:
                outcomes[t] = exc
            took[t] = time.monotonic() - started

        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        resume = threading.Timer(stop, os.kill, (nsqd.pid, signal.SIGCONT))
        os.kill(nsqd.pid, signal.SIGSTOP)
        resume.start()
        try:
            go.wait()
            for thread in threads:
                thread.join(30)
        finally:
            resume.join()
            os.kill(nsqd.pid, signal.SIGCONT)
    assert max(took) < 2 + 0.5, (took, outcomes)
    assert all(isinstance(o, NSQTimeout) for o in outcomes), outcomes
    assert "may or may not have been published" in str(outcomes[0])
    # Once nsqd is done with every connection, no body was stored twice: what was sent
    # before the stop may be stored (nsqd reads it when it resumes, up to our close), but it
    # is never sent again by a retry.
    wait_for(lambda: producer_connections(nsqd.http) == 0, what="nsqd done with every connection")
    stored_count = int(topic_stats(nsqd.http, topic)["message_count"])
    bodies = [m.body for m in anyio.run(drain, nsqd.tcp, topic, "check", stored_count)]
    assert b"warm" in bodies and len(bodies) == len(set(bodies)) == stored_count <= 9, bodies


def test_settings_nsqd_refuses_fail_the_start(cluster_factory):
    """As the async Producer: 30 s heartbeats refused by an nsqd that allows 10 s."""
    from smartnsq.errors import BadBody, ConfigRefused

    nsqd = cluster_factory("classic", nsqd_args=["--max-heartbeat-interval=10s"]).nsqd[0]
    with (
        pytest.raises(ConfigRefused, match="heartbeat") as info,
        Producer([nsqd.tcp], heartbeat_interval=30),
    ):
        pytest.fail("entered")
    assert isinstance(info.value.__cause__, BadBody)
    # Used without 'with': its publish raises the same, at once, not retried.
    producer = Producer([nsqd.tcp], heartbeat_interval=30, max_retries=3)
    started = time.monotonic()
    with pytest.raises(ConfigRefused):
        producer.publish(unique("hb"), b"x")
    assert time.monotonic() - started < 1
    assert producer.stats().retried == 0
    producer.close()


def test_an_nsqd_that_never_handshakes_is_a_failed_connect(cluster_factory):
    """As the async Producer's twin (tests/integration/test_producer_classic.py): the first
    of two nsqd stopped (SIGSTOP), ``timeout=3``, ``connect_timeout=1``: every publish fails
    over to the other nsqd within its timeout. Before: the handshake took min(timeout, 5 s)
    and the publish raised NSQTimeout "may or may not have been published"."""
    cluster = cluster_factory("classic", nsqd=2)
    stopped, live = cluster.nsqd
    topic = unique("shsstop")
    took: list[float] = []
    stopped.signal(signal.SIGSTOP)
    try:
        with Producer(
            [live.tcp, stopped.tcp], timeout=3, connect_timeout=1, max_retries=0
        ) as producer:
            for i in range(4):
                started = time.monotonic()
                producer.publish(topic, b"m%d" % i)
                took.append(time.monotonic() - started)
            # The start connected to the live one only; publishes take turns, so one tried
            # the stopped nsqd.
            assert producer.stats().nodes[stopped.tcp].errors >= 1
    finally:
        stopped.signal(signal.SIGCONT)
    assert max(took) < 3, took
    assert int(topic_stats(live.http, topic)["message_count"]) == 4


def test_a_publish_whose_time_ran_out_before_sending_says_it_was_not_sent(cluster_factory):
    """The only nsqd stopped before the Producer connects; ``timeout=1`` runs out in the
    handshake: NoNsqdAvailable saying it was NOT sent, within the timeout."""
    from smartnsq.errors import NoNsqdAvailable

    nsqd = cluster_factory("classic", nsqd=1).nsqd[0]
    nsqd.signal(signal.SIGSTOP)
    try:
        with Producer([nsqd.tcp], timeout=1, connect_timeout=2) as producer:
            started = time.monotonic()
            with pytest.raises(NoNsqdAvailable, match="not sent") as caught:
                producer.publish(unique("shsstop"), b"x")
            took = time.monotonic() - started
    finally:
        nsqd.signal(signal.SIGCONT)
    assert "may or may not" not in str(caught.value)
    assert took < 1 + 0.5, took


def test_a_topic_whose_every_nsqd_is_down_goes_to_another_nsqd(cluster_factory):
    """As the async Producer's twin: the topic's only nsqd stopped, another alive; a
    lookupd-only Producer publishes to the live one."""
    from tests.helpers import create_channel

    cluster = cluster_factory("classic", nsqd=2)
    stopped, live = cluster.nsqd
    topic = unique("sorphan")
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
        with Producer(
            lookupd_http_addresses=lookupds(cluster), timeout=3, connect_timeout=1
        ) as producer:
            for i in range(3):
                producer.publish(topic, b"m%d" % i)
    finally:
        stopped.signal(signal.SIGCONT)
    assert int(topic_stats(live.http, topic)["message_count"]) == 3
