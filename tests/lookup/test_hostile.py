"""Hostile lookupd and nsqd HTTP answers, from small fake servers on loopback: malformed
HTTP, garbage JSON, a 10^5-entry producer list, a 50 MB body, a redirect, answers that never
end. Each is bounded in time and memory, logged once however often it is polled, and the
other lookupds keep serving."""

from __future__ import annotations

import json
import logging
import re
import time
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

import smartnsq.offsets
from smartnsq import Consumer, Producer
from smartnsq.errors import LookupFailed, NsqdHttpFailed
from smartnsq.lookup.client import MAX_RESPONSE_SIZE, fetch_lookup
from smartnsq.lookup.manager import LookupManager
from smartnsq.lookup.model import Node
from smartnsq.net.http import HttpClient
from smartnsq.offsets import read_partition
from tests.helpers import (
    FakeApi,
    Flood,
    Route,
    drip,
    fake_api,
    http_json,
    json_body,
    listed_producers,
    never_answer,
    raw,
    unique,
    wait_until,
)
from tests.protocol.test_http import MALFORMED

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

GOOD = json_body({"producers": [{"broadcast_address": "10.0.0.1", "tcp_port": 4150}]})
TIMEOUT = 1.0  # each request's, in the managers below
POLLS = 5


@pytest.fixture
async def pair(anyio_backend: str) -> AsyncIterator[tuple[FakeApi, FakeApi]]:
    """A hostile lookupd and a good one."""
    async with fake_api() as hostile, fake_api() as good:
        good.routes["/lookup"] = GOOD
        yield hostile, good


def warnings_about(caplog: pytest.LogCaptureFixture, url: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and url in r.getMessage()
    ]


@pytest.mark.parametrize(("answer", "error"), MALFORMED)
async def test_a_malformed_answer_fails_that_lookupd_and_the_next_one_serves(
    pair: tuple[FakeApi, FakeApi], caplog: pytest.LogCaptureFixture, answer: bytes, error: str
) -> None:
    hostile, good = pair
    hostile.routes["/lookup"] = raw(answer)
    with pytest.raises(LookupFailed, match=error):
        await fetch_lookup(HttpClient(), hostile.url, "t", timeout=TIMEOUT)
    caplog.set_level(logging.WARNING, logger="smartnsq")
    async with LookupManager([hostile.url, good.url], answer_grace=TIMEOUT) as lm:
        layout = await lm.lookup("t")
        assert [n.broadcast_address for n in layout.producers] == ["10.0.0.1"]
        assert lm.ranked() == [good.url, hostile.url]
    (warning,) = warnings_about(caplog, hostile.url)
    assert re.search(error, warning), warning


def producers(n: int) -> bytes:
    entries = [{"address": f"h{i}", "tcp_port": i % 65535 + 1} for i in range(n)]
    return json.dumps({"producers": entries}, separators=(",", ":")).encode()


async def redirect(request: Any, stream: anyio.abc.ByteStream) -> None:
    await stream.send(b"HTTP/1.1 302 Found\r\nLocation: http://10.0.0.9/lookup\r\n\r\n")


async def endless_interim(request: Any, stream: anyio.abc.ByteStream) -> None:
    while True:
        await stream.send(b"HTTP/1.1 103 Early Hints\r\n\r\n")


async def endless_head(request: Any, stream: anyio.abc.ByteStream) -> None:
    await stream.send(b"HTTP/1.1 200 OK\r\n")
    while True:
        await stream.send(b"X: y\r\n" * 1000)


FIFTY_MB = 50 << 20
HOSTILE: list[Any] = [
    pytest.param(lambda: (200, b"\x00\xff<html>not json"), "unusable answer", id="garbage"),
    pytest.param(
        lambda: (200, b'{"producers": [{"address": "a", "tcp_'), "unusable", id="cut-json"
    ),
    pytest.param(lambda: (200, b"[" * 100_000), "unusable", id="deep-json"),
    pytest.param(lambda: (200, producers(10**5)), "lists more than 4096", id="1e5-producers"),
    pytest.param(lambda: Flood(FIFTY_MB, "length"), "more than", id="50MB-length"),
    pytest.param(lambda: Flood(FIFTY_MB, "chunked"), "more than", id="50MB-chunked"),
    pytest.param(lambda: Flood(FIFTY_MB, "close"), "more than", id="50MB-to-close"),
    pytest.param(lambda: redirect, "HTTP 302 .a redirect; not followed", id="redirect"),
    pytest.param(lambda: never_answer, "had not answered", id="silent"),
    pytest.param(lambda: drip(10**6, 0.01), "had not answered", id="drip"),
    pytest.param(lambda: Flood(None, "chunked"), "more than", id="endless-body"),
    pytest.param(lambda: endless_interim, "interim", id="endless-1xx"),
    pytest.param(lambda: endless_head, "pass 65536 bytes", id="endless-head"),
]


@pytest.mark.parametrize(("make", "error"), HOSTILE)
async def test_a_hostile_lookupd_is_bounded_logged_once_and_the_others_serve(
    pair: tuple[FakeApi, FakeApi], caplog: pytest.LogCaptureFixture, make: Any, error: str
) -> None:
    hostile, good = pair
    route: Route = make()
    hostile.routes["/lookup"] = hostile.routes["/listlookup"] = route
    caplog.set_level(logging.WARNING, logger="smartnsq")
    slowest = 0.0
    tracemalloc.start()
    try:
        # max_backoff=0: the hostile lookupd is asked again at every poll
        async with LookupManager([hostile.url, good.url], timeout=TIMEOUT, max_backoff=0) as lm:
            for _ in range(POLLS):
                started = time.monotonic()
                layout = await lm.lookup("t")
                slowest = max(slowest, time.monotonic() - started)
                assert [n.broadcast_address for n in layout.producers] == ["10.0.0.1"]
                assert lm.ranked() == [good.url, hostile.url]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(hostile.calls("/lookup")) == POLLS
    assert slowest < TIMEOUT + 1, slowest  # the good answer + answer_grace; never more
    # The cap (4 MiB) held a few times over: the fake server's copy (same process), the bytes
    # received and the body handed on. Unbounded, the floods held 50 MB, and decoding the
    # 10^5 producers 40 MB more.
    assert peak < 6 * MAX_RESPONSE_SIZE, peak
    if isinstance(route, Flood):
        assert route.sent < FIFTY_MB * POLLS / 2, route.sent  # abandoned, not read through
    (warning,) = warnings_about(caplog, hostile.url)  # once, not once per poll
    assert re.search(error, warning), warning


async def test_a_hostile_lookupd_alone_fails_within_the_timeout(
    pair: tuple[FakeApi, FakeApi],
) -> None:
    hostile, _ = pair
    hostile.routes["/lookup"] = drip(10**6, 0.01)
    started = time.monotonic()
    with pytest.raises(LookupFailed, match=f"within {TIMEOUT}s"):
        await fetch_lookup(HttpClient(), hostile.url, "t", timeout=TIMEOUT)
    assert time.monotonic() - started < TIMEOUT + 1


async def test_bad_broadcast_addresses_are_skipped_and_logged_once(
    pair: tuple[FakeApi, FakeApi], caplog: pytest.LogCaptureFixture
) -> None:
    hostile, _ = pair
    bad = ["\u65e5\u672c", "a\r\nb", "h/x", "[::1]", "a b", "x" * 300, "::g"]
    entries = [{"broadcast_address": b, "tcp_port": 4150, "http_port": 4151} for b in bad]
    ok = ["10.0.0.1", "::1", "fe80::1%eth0", "nsqd-1.example_internal"]
    entries += [{"broadcast_address": h, "tcp_port": 4150} for h in ok]
    hostile.routes["/lookup"] = json_body({"producers": entries})
    caplog.set_level(logging.WARNING, logger="smartnsq")
    async with LookupManager([hostile.url]) as lm:
        for _ in range(3):
            layout = await lm.lookup("t")
            assert [n.broadcast_address for n in layout.producers] == ok
    (warning,) = warnings_about(caplog, hostile.url)
    assert "invalid address" in warning


# nsqd's HTTP side: a partition leader's /stats, read when a consumer moves its start


def nsqd(address: str) -> Node:
    host, _, port = address.rpartition(":")
    return Node(host, 4150, int(port))


NSQD_HOSTILE: list[Any] = [
    pytest.param(lambda: (200, b"\x00 not json"), "unusable stats", id="garbage"),
    pytest.param(lambda: Flood(FIFTY_MB, "length"), "more than", id="50MB"),
    pytest.param(lambda: Flood(None, "close"), "more than", id="endless-body"),
    pytest.param(lambda: redirect, "HTTP 302", id="redirect"),
    pytest.param(lambda: drip(10**6, 0.01), "within", id="drip"),
    pytest.param(lambda: never_answer, "within", id="silent"),
    *[pytest.param(lambda p=p: raw(p.values[0]), p.values[1], id=p.id) for p in MALFORMED],
]


@pytest.mark.parametrize(("make", "error"), NSQD_HOSTILE)
async def test_a_hostile_nsqd_stats_answer_is_a_bounded_nsqd_http_failure(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch, make: Any, error: str
) -> None:
    monkeypatch.setattr(smartnsq.offsets, "REQUEST_TIMEOUT", TIMEOUT)
    async with fake_api() as api:
        api.routes["/stats"] = make()
        started = time.monotonic()
        with pytest.raises(NsqdHttpFailed, match=error):
            await read_partition(HttpClient(), "t", 0, nsqd(api.address), "ch")
    assert time.monotonic() - started < TIMEOUT + 1


# A consumer and a producer given a hostile lookupd next to a real one


@pytest.mark.integration
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: (200, b"\x00\xff<html>not json"), id="garbage"),
        pytest.param(lambda: Flood(FIFTY_MB, "chunked"), id="50MB"),
        pytest.param(lambda: drip(10**6, 0.01), id="drip"),
        pytest.param(lambda: raw(MALFORMED[0].values[0]), id="two-content-lengths"),
    ],
)
async def test_clients_reach_nsqd_through_the_healthy_lookupd(
    classic_cluster: Any, anyio_backend: str, caplog: pytest.LogCaptureFixture, make: Any
) -> None:
    nsqd_http = classic_cluster.nsqd[0].http
    real = classic_cluster.lookupd[0].http
    topic = unique("hostile")
    http_json(f"http://{nsqd_http}/topic/create?topic={topic}", "POST")
    await wait_until(lambda: listed_producers(real, topic), 10, "registration")
    bodies = [f"m{i}".encode() for i in range(20)]
    caplog.set_level(logging.WARNING, logger="smartnsq")
    async with fake_api() as hostile:
        hostile.routes["/lookup"] = hostile.routes["/listlookup"] = make()
        lookupd = [hostile.url, real]
        async with Producer(lookupd_http_addresses=lookupd) as producer:
            for body in bodies:
                await producer.publish(topic, body)
        assert len(warnings_about(caplog, hostile.url)) == 1
        got: list[bytes] = []
        async with Consumer(
            topic,
            "c",
            lambda m: got.append(m.body),
            lookupd_http_addresses=lookupd,
            lookupd_poll_interval=0.1,
        ):
            await wait_until(lambda: sorted(got) == sorted(bodies), 10, "every message")
            # it polls on, asking the hostile lookupd again (/listlookup at every poll, /lookup
            # whenever its back-off allows)
            polled = len(hostile.requests)
            await wait_until(lambda: len(hostile.requests) >= polled + 3, 10, "more polls")
    assert len(warnings_about(caplog, hostile.url)) == 2  # once for each client
