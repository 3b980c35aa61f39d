"""Mutual TLS: an nsqd that requires a client certificate signed by its CA.

docs/tls-auth.md promises ``context.load_cert_chain(...)`` works; the client's TLS is our own
codec on asyncio and in the blocking client, anyio's on trio, so every path is checked.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from smartnsq import Consumer, Message, Producer
from smartnsq import sync as blocking
from smartnsq.errors import NSQError
from tests.helpers import (
    EVERY_LOOP,
    channel_stats,
    start_tls_cluster,
    topic_stats,
    unique,
    wait_for,
    wait_until,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def mtls_cluster(tmp_path_factory: pytest.TempPathFactory, ca: trustme.CA) -> Iterator[object]:
    d: Path = tmp_path_factory.mktemp("mtls")
    args = (f"--tls-root-ca-file={d / 'ca.pem'}", "--tls-client-auth-policy=require-verify")
    with start_tls_cluster(ca, d, *args) as cluster:
        yield cluster


def _context(ca: trustme.CA, with_cert: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    if with_cert:
        ca.issue_cert("client.example").configure_cert(ctx)
    return ctx


@EVERY_LOOP
async def test_a_client_certificate_publishes_and_consumes(mtls_cluster, ca, anyio_backend):
    nsqd = mtls_cluster.nsqd[0]  # type: ignore[attr-defined]
    topic = unique("mtls")
    bodies = [b"x" * 40_000, *(f"m{i}".encode() for i in range(20))]  # one spans records
    ctx = _context(ca, with_cert=True)
    async with Producer([nsqd.tcp], tls=ctx) as producer:
        await producer.publish_many(topic, bodies)
    got: list[bytes] = []

    async def handle(message: Message) -> None:
        got.append(message.body)

    async with Consumer(topic, "c", handle, nsqd_tcp_addresses=[nsqd.tcp], tls=ctx) as consumer:
        await wait_until(lambda: consumer.stats().finished == len(bodies), 20, "all FINed")
    assert sorted(got) == sorted(bodies)
    c = channel_stats(nsqd.http, topic, "c")
    assert c is not None and c["depth"] == 0 and c["in_flight_count"] == 0


@EVERY_LOOP
async def test_without_a_client_certificate_nothing_is_published(mtls_cluster, ca, anyio_backend):
    nsqd = mtls_cluster.nsqd[0]  # type: ignore[attr-defined]
    topic = unique("mtls_refused")
    async with Producer([nsqd.tcp], tls=_context(ca, with_cert=False), max_retries=0) as producer:
        with pytest.raises(NSQError):
            await producer.publish(topic, b"x")
    assert topic_stats(nsqd.http, topic) is None


def test_blocking_client_certificate(mtls_cluster, ca):
    nsqd = mtls_cluster.nsqd[0]  # type: ignore[attr-defined]
    topic = unique("mtls_sync")
    with blocking.Producer([nsqd.tcp], tls=_context(ca, with_cert=True)) as producer:
        for i in range(50):  # one at a time: the path that polls for each answer
            producer.publish(topic, f"s{i}".encode())
    wait_for(lambda: (topic_stats(nsqd.http, topic) or {}).get("message_count") == 50)
    refused = blocking.Producer([nsqd.tcp], tls=_context(ca, with_cert=False), max_retries=0)
    with refused, pytest.raises(NSQError):
        refused.publish(topic, b"x")
    assert (topic_stats(nsqd.http, topic) or {})["message_count"] == 50
