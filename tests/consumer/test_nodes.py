"""A Consumer's start against settings a real nsqd refuses: ConfigRefused at the start,
reconnecting for failures that reconnecting can fix, and a loud line for a refusal later."""

from __future__ import annotations

import logging
import re
import signal
import time
from typing import Any

import anyio
import pytest

from compat.cluster import free_port
from smartnsq import Consumer
from smartnsq.errors import AuthFailed, BadBody, ConfigRefused, InvalidCommand, Unauthorized
from smartnsq.sync import Consumer as SyncConsumer
from tests.helpers import start_tls_cluster, unique, wait_until
from tests.integration.test_producer_classic import auth_server  # noqa: F401 - a fixture

pytestmark = pytest.mark.integration


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_setting_nsqd_refuses_fails_the_start(classic_cluster: Any, anyio_backend: str):
    """Before: 'async with' entered, and the consumer reconnected for ever (nsqd's
    --min-output-buffer-timeout is 25 ms by default: 5 ms is refused at IDENTIFY)."""
    nsqd = classic_cluster.nsqd[0]
    started = time.monotonic()
    consumer = Consumer(
        unique("obuf_bad"), "c", nsqd_tcp_addresses=[nsqd.tcp], output_buffer_timeout=0.005
    )
    with pytest.raises(ConfigRefused, match="output buffer timeout") as info:
        async with consumer:
            pytest.fail("entered")
    assert time.monotonic() - started < 2
    assert isinstance(info.value.__cause__, BadBody)
    assert info.value.address == nsqd.tcp
    assert "--min/--max-output-buffer-timeout" in str(info.value)  # what to change
    assert isinstance(consumer.last_error, BadBody)
    # run() starts the same way.
    again = Consumer(
        unique("obuf_bad"), "c", nsqd_tcp_addresses=[nsqd.tcp], output_buffer_timeout=0.005
    )
    with anyio.fail_after(5), pytest.raises(ConfigRefused, match="output buffer timeout"):
        await again.run()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize(
    ("options", "text"),
    [
        ({"msg_timeout": 3600}, "msg timeout (3600000) is invalid"),  # --max-msg-timeout 15m
        ({"output_buffer_size": 100_000}, "output buffer size (100000) is invalid"),  # 64 KiB
        ({"output_buffer_timeout": 60}, "output buffer timeout (60000) is invalid"),  # 30 s
    ],
)
async def test_each_identify_limit_fails_the_start(
    classic_cluster: Any, anyio_backend: str, options: dict[str, Any], text: str
):
    nsqd = classic_cluster.nsqd[0]
    consumer = Consumer(unique("limits"), "c", nsqd_tcp_addresses=[nsqd.tcp], **options)
    with anyio.fail_after(5), pytest.raises(ConfigRefused, match=re.escape(text)):
        async with consumer:
            pytest.fail(f"entered with {options}")


def test_the_blocking_consumer_fails_its_start_too(classic_cluster: Any):
    nsqd = classic_cluster.nsqd[0]
    consumer = SyncConsumer(
        unique("obuf_bad"), "c", nsqd_tcp_addresses=[nsqd.tcp], output_buffer_timeout=0.005
    )
    with pytest.raises(ConfigRefused, match="E_BAD_BODY"), consumer:
        pytest.fail("entered")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_auth_refused_or_missing_fails_the_start(
    cluster_factory: Any,
    auth_server: str,  # noqa: F811
    anyio_backend: str,
):
    nsqd = cluster_factory("classic", nsqd_args=[f"--auth-http-address={auth_server}"]).nsqd[0]
    topic = unique("auth_c")
    cases: list[tuple[dict[str, Any], type[BaseException] | None]] = [
        ({"auth_secret": "wrong"}, AuthFailed),
        # its dead-letter producer meets the same refusal; the start still says it plainly
        ({"auth_secret": "wrong", "dead_letter_topic": "auth_dead"}, AuthFailed),
        ({}, None),  # nsqd requires AUTH, no auth_secret set: refused before sending it
        ({"auth_secret": "good-secret", "topic": unique("other")}, Unauthorized),  # at SUB
        ({"heartbeat_interval": -1, "auth_secret": "good-secret"}, InvalidCommand),  # at SUB
    ]
    for options, cause in cases:
        name = options.pop("topic", topic)
        consumer = Consumer(name, "c", nsqd_tcp_addresses=[nsqd.tcp], **options)
        with anyio.fail_after(10), pytest.raises(ConfigRefused) as info:
            async with consumer:
                pytest.fail(f"entered with {options}")
        if cause is None:
            assert "auth_secret" in str(info.value)
        else:
            assert isinstance(info.value.__cause__, cause), (options, info.value)
    # The right secret on an allowed topic starts.
    async with Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp], auth_secret="good-secret") as c:
        assert c.stats().connections == 1


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_nsqd_that_cannot_be_reached_does_not_fail_the_start(
    classic_cluster: Any, anyio_backend: str
):
    """Reconnecting can fix it: the start returns, the good nsqd is consumed from."""
    nsqd = classic_cluster.nsqd[0]
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    async with Consumer(unique("mixed"), "c", nsqd_tcp_addresses=[dead, nsqd.tcp]) as consumer:
        await wait_until(lambda: consumer.stats().connections == 1, 10, "subscribed")
        assert consumer.last_error is None
    started = time.monotonic()
    async with Consumer(unique("dead"), "c", nsqd_tcp_addresses=[dead]):
        assert time.monotonic() - started < 2  # its first attempt failed: no waiting more


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_refusal_after_a_good_start_is_an_error_once(
    cluster_factory: Any, anyio_backend: str, caplog: pytest.LogCaptureFixture
):
    """nsqd restarted with a higher --min-output-buffer-timeout refuses what it took."""
    cluster = cluster_factory("classic", nsqd=1)
    nsqd = cluster.nsqd[0]
    caplog.set_level(logging.DEBUG, "smartnsq")
    async with Consumer(
        unique("later"),
        "c",
        nsqd_tcp_addresses=[nsqd.tcp],
        output_buffer_timeout=0.03,
        reconnect_min=0.05,
        reconnect_max=0.2,
    ) as consumer:
        await wait_until(lambda: consumer.stats().connections == 1, 10, "subscribed")
        await anyio.to_thread.run_sync(cluster.kill_nsqd, 0, signal.SIGTERM)
        nsqd.argv.append("--min-output-buffer-timeout=50ms")
        await anyio.to_thread.run_sync(cluster.restart_nsqd, 0)
        await wait_until(lambda: isinstance(consumer.last_error, BadBody), 10, "the refusal")
        tries = len([r for r in caplog.records if "still refuses" in r.getMessage()])
        await wait_until(
            lambda: (
                len([r for r in caplog.records if "still refuses" in r.getMessage()]) >= tries + 3
            ),
            10,
            "more attempts",
        )
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and "smartnsq" in r.name]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert "refuses this client's settings" in errors[0].getMessage()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_tls_that_nsqd_requires_fails_the_start(tmp_path: Any, anyio_backend: str):
    """nsqd --tls-required answers SUB without TLS with E_INVALID: a setting, not an outage;
    a Producer meets it at its first publish (only a command shows it)."""
    import trustme

    from smartnsq import Producer

    with start_tls_cluster(trustme.CA(), tmp_path) as cluster:
        nsqd = cluster.nsqd[0]
        with anyio.fail_after(10), pytest.raises(ConfigRefused, match="tls=True") as info:
            async with Consumer(unique("tlsreq"), "c", nsqd_tcp_addresses=[nsqd.tcp]):
                pytest.fail("entered")
        assert isinstance(info.value.__cause__, InvalidCommand)
        async with Producer([nsqd.tcp], max_retries=3) as producer:
            with anyio.fail_after(5), pytest.raises(ConfigRefused, match="TLS required"):
                await producer.publish(unique("tlsreq"), b"x")
            assert producer.stats().retried == 0


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_through_lookupd_on_the_youzan_fork(youzan_cluster: Any, anyio_backend: str):
    """The start waits for the first lookup, then the partitions' nsqd: the fork allows an
    output buffer timeout of at most 1 s, so 2 s fails the start; 0.5 s starts."""
    from compat.youzan import create_topic
    from tests.helpers import lookupds

    topic = unique("yz_refuse")
    create_topic(youzan_cluster, topic, partitions=2, replicas=1, channel="ch")
    where = lookupds(youzan_cluster)
    with anyio.fail_after(10), pytest.raises(ConfigRefused, match="output buffer timeout"):
        async with Consumer(topic, "ch", lookupd_http_addresses=where, output_buffer_timeout=2):
            pytest.fail("entered")
    async with Consumer(
        topic, "ch", lookupd_http_addresses=where, output_buffer_timeout=0.5
    ) as consumer:
        await wait_until(lambda: consumer.stats().connections == 2, 10, "both partitions")
