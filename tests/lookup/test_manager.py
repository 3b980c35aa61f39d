"""LookupManager edge cases against fake lookupds on loopback (real HTTP servers that answer
well, late, badly or not at all): discovery, ranking, merging."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import anyio
import pytest

import smartnsq.net.http
from smartnsq.errors import LookupFailed, TopicNotFound
from smartnsq.lookup.manager import LookupManager
from smartnsq.net.http import HttpClient, Response
from tests.helpers import (
    FakeApi,
    drip,
    fake_api,
    hang_up,
    json_body,
    later,
    never_answer,
    unused_address,
)

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

NO_LISTLOOKUP = (404, b"")  # a classic lookupd


@pytest.fixture
async def lookupds(anyio_backend: str) -> AsyncIterator[tuple[FakeApi, FakeApi, FakeApi]]:
    """Three fake lookupds, A, B and C."""
    async with fake_api() as a, fake_api() as b, fake_api() as c:
        yield a, b, c


def node(ip: str, port: int = 4150) -> dict[str, Any]:
    return {"broadcast_address": ip, "tcp_port": port, "http_port": port + 1}


def listlookup(*urls: str, leader: str | None = None) -> dict[str, Any]:
    def entry(url: str) -> dict[str, str]:
        host, port = url.removeprefix("http://").split(":")
        return {"ID": url, "NodeIP": host, "TcpPort": "4160", "HttpPort": port, "RpcPort": "1"}

    return {
        "lookupdnodes": [entry(u) for u in urls],
        "lookupdleader": entry(leader) if leader else {"ID": "", "NodeIP": "", "HttpPort": ""},
    }


def producers(*ips: str) -> tuple[int, bytes]:
    return json_body({"producers": [node(ip) for ip in ips]})


async def test_listlookup_expands_seeds_and_finds_leader(
    lookupds: tuple[FakeApi, FakeApi, FakeApi],
) -> None:
    a, b, _ = lookupds
    a.routes["/listlookup"] = json_body(listlookup(a.url, b.url, leader=b.url))
    async with LookupManager([a.url]) as lm:
        assert await lm.discover() == [a.url, b.url]
        assert lm.leader == b.url


@pytest.mark.parametrize("response", [(404, b""), (200, b""), (200, b"{bad")])
async def test_classic_or_odd_listlookup_uses_the_seed(
    lookupds: tuple[FakeApi, FakeApi, FakeApi], response: tuple[int, bytes]
) -> None:
    a, _, _ = lookupds
    a.routes["/listlookup"] = response
    async with LookupManager([a.url]) as lm:
        assert await lm.discover() == [a.url]
        assert a.url not in lm._health  # an answer, not a failure
    assert len(a.calls("/listlookup")) == 1


async def test_failed_lookupd_is_ranked_down_and_recovers(
    lookupds: tuple[FakeApi, FakeApi, FakeApi],
) -> None:
    a, b, _ = lookupds
    a.routes["/listlookup"] = b.routes["/listlookup"] = NO_LISTLOOKUP
    a.routes["/lookup"] = hang_up  # the connection is closed without an answer
    b.routes["/lookup"] = producers("10.0.0.2")
    async with LookupManager([a.url, b.url], max_backoff=0) as lm:  # back-off expires at once
        layout = await lm.lookup("t")
        assert [n.broadcast_address for n in layout.producers] == ["10.0.0.2"]
        assert lm.ranked() == [b.url, a.url]
        a.routes["/lookup"] = producers("10.0.0.1")
        layout = await lm.lookup("t")
        assert {n.broadcast_address for n in layout.producers} == {"10.0.0.1", "10.0.0.2"}
        assert a.url in lm.ranked()[:2] and not lm._health[a.url].failures  # recovered
    assert len(a.calls("/lookup")) == 2


async def test_all_down_raises_lookup_failed(lookupds: tuple[FakeApi, FakeApi, FakeApi]) -> None:
    a, _, _ = lookupds
    a.routes["/listlookup"] = never_answer
    a.routes["/lookup"] = (500, b"boom")
    async with LookupManager([a.url], timeout=0.2) as lm:
        with anyio.fail_after(5), pytest.raises(LookupFailed, match="no lookupd answered"):
            await lm.lookup("t")
    assert len(a.calls("/lookup")) == 1


async def test_write_lookup_404_is_topic_not_found_read_is_empty(
    lookupds: tuple[FakeApi, FakeApi, FakeApi],
) -> None:
    a, _, _ = lookupds
    a.routes["/listlookup"] = NO_LISTLOOKUP
    a.routes["/lookup"] = json_body({"message": "Key not found"}, 404)
    async with LookupManager([a.url]) as lm:
        with pytest.raises(TopicNotFound):
            await lm.lookup("t", "w")
        layout = await lm.lookup("t", "r")
        assert not layout.producers and not layout.partitions


async def test_partitions_merge_prefers_the_leader(
    lookupds: tuple[FakeApi, FakeApi, FakeApi],
) -> None:
    a, b, _ = lookupds
    a.routes["/listlookup"] = json_body(listlookup(a.url, b.url, leader=b.url))
    stale = {"partitions": {"0": node("10.0.0.1"), "1": node("10.0.0.1")}, "producers": []}
    fresh = {"partitions": {"0": node("10.0.0.2")}, "producers": [node("10.0.0.2")]}
    a.routes["/lookup"] = json_body(stale)
    b.routes["/lookup"] = json_body(fresh)
    async with LookupManager([a.url]) as lm:
        layout = await lm.lookup("t")
    assert layout.partitions[0].broadcast_address == "10.0.0.2"  # leader's answer wins
    assert layout.partitions[1].broadcast_address == "10.0.0.1"  # union of the rest
    assert len(a.calls("/lookup")) == len(b.calls("/lookup")) == 1


async def test_refresh_is_rate_limited_and_shared(
    lookupds: tuple[FakeApi, FakeApi, FakeApi],
) -> None:
    a, _, _ = lookupds
    a.routes["/listlookup"] = NO_LISTLOOKUP
    a.routes["/lookup"] = producers("10.0.0.1")
    async with LookupManager([a.url], min_refresh_interval=60) as lm:
        async with anyio.create_task_group() as tg:
            for _ in range(100):
                tg.start_soon(lm.refresh, "t", "w")
        assert len(a.calls("/lookup")) == 1
        await lm.refresh("t", "w")
        assert len(a.calls("/lookup")) == 1  # still within min_refresh_interval


async def test_sends_accept_header_and_metainfo(
    lookupds: tuple[FakeApi, FakeApi, FakeApi],
) -> None:
    a, _, _ = lookupds
    a.routes["/listlookup"] = NO_LISTLOOKUP
    a.routes["/lookup"] = json_body({"producers": []})
    async with LookupManager([a.url]) as lm:
        await lm.lookup("t", "w")
    [request] = a.calls("/lookup")
    assert request.headers["accept"] == "application/vnd.nsq; version=1.0"
    assert request.query == {"topic": "t", "access": "w", "metainfo": "true"}


async def test_cached_answer_expires_so_producers_poll(
    lookupds: tuple[FakeApi, FakeApi, FakeApi],
) -> None:
    a, _, _ = lookupds
    a.routes["/listlookup"] = NO_LISTLOOKUP
    a.routes["/lookup"] = producers("10.0.0.1")
    async with LookupManager([a.url], cache_ttl=60) as lm:
        await lm.lookup("t", "w")
        assert lm.cached("t", "w") is not None
    async with LookupManager([a.url], cache_ttl=1e-9, cache_jitter=0) as lm:
        await lm.lookup("t", "w")
        assert lm.cached("t", "w") is None  # expired: the next publish looks up again


async def test_slow_lookupd_costs_the_grace_not_the_timeout(
    lookupds: tuple[FakeApi, FakeApi, FakeApi],
) -> None:
    a, b, _ = lookupds
    # 200 bytes, one every 50 ms: 10 s in all, each read quick (never a read timeout)
    a.routes["/listlookup"] = a.routes["/lookup"] = drip(200, 0.05)
    b.routes["/listlookup"] = NO_LISTLOOKUP
    b.routes["/lookup"] = producers("10.0.0.2")
    async with LookupManager([a.url, b.url], timeout=5, answer_grace=0.1) as lm:
        start = anyio.current_time()
        assert await lm.discover() == [a.url, b.url]
        assert anyio.current_time() - start < 2
        assert lm._health[a.url].failures == 1  # late: ranked down
        lm._health[a.url].retry_at = 0  # ask it again at once
        start = anyio.current_time()
        layout = await lm.lookup("t")
        assert anyio.current_time() - start < 2
        assert [n.broadcast_address for n in layout.producers] == ["10.0.0.2"]
        assert lm._health[a.url].failures == 2 and lm.ranked() == [b.url, a.url]
    assert len(a.calls("/lookup")) == 1  # it was asked, and was late


async def test_an_empty_answer_does_not_start_the_grace(
    lookupds: tuple[FakeApi, FakeApi, FakeApi],
) -> None:
    a, b, _ = lookupds
    a.routes["/listlookup"] = b.routes["/listlookup"] = NO_LISTLOOKUP
    a.routes["/lookup"] = json_body({"producers": []})
    b.routes["/lookup"] = later(0.3, producers("10.0.0.2"))
    async with LookupManager([a.url, b.url], answer_grace=0.01) as lm:
        layout = await lm.lookup("t")
    assert [n.broadcast_address for n in layout.producers] == ["10.0.0.2"]


async def test_answers_within_the_grace_are_merged(
    lookupds: tuple[FakeApi, FakeApi, FakeApi],
) -> None:
    a, b, _ = lookupds
    a.routes["/listlookup"] = b.routes["/listlookup"] = NO_LISTLOOKUP
    a.routes["/lookup"] = producers("10.0.0.1")
    b.routes["/lookup"] = later(0.1, producers("10.0.0.2"))
    async with LookupManager([a.url, b.url], answer_grace=2) as lm:
        layout = await lm.lookup("t")
    assert {n.broadcast_address for n in layout.producers} == {"10.0.0.1", "10.0.0.2"}


async def test_unexpected_error_is_that_lookupds_failure(
    lookupds: tuple[FakeApi, FakeApi, FakeApi], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b, _ = lookupds
    real_get = HttpClient.get

    async def get(
        self: HttpClient,
        url: str,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        *,
        max_size: int | None = None,
    ) -> Response:
        if url == f"{a.url}/listlookup":
            raise RuntimeError("bug in a transport")
        if url == f"{a.url}/lookup":
            raise RecursionError("deep")
        return await real_get(self, url, params, headers, max_size=max_size)

    monkeypatch.setattr(HttpClient, "get", get)  # A's requests break before they are sent
    b.routes["/listlookup"] = NO_LISTLOOKUP
    b.routes["/lookup"] = producers("10.0.0.2")
    async with LookupManager([a.url, b.url], max_backoff=0) as lm:
        layout = await lm.lookup("t")
        assert [n.broadcast_address for n in layout.producers] == ["10.0.0.2"]
        assert lm._health[a.url].failures == 2  # /listlookup and /lookup
    async with LookupManager([a.url]) as lm:
        with pytest.raises(LookupFailed, match="RecursionError"):
            await lm.refresh("t", "w")
        with pytest.raises(LookupFailed, match="RecursionError"):
            await lm.lookup("t")
    assert not a.requests and len(b.calls("/lookup")) == 1


async def test_listlookup_is_capped_and_bad_nodes_skipped(
    lookupds: tuple[FakeApi, FakeApi, FakeApi],
) -> None:
    a, b, c = lookupds
    body = listlookup(a.url, b.url, leader=b.url)
    body["lookupdnodes"].append({"NodeIP": "10.0.0.9", "HttpPort": "0"})
    a.routes["/listlookup"] = json_body(body)
    c.routes["/listlookup"] = (200, b" " * 5000)
    async with LookupManager([a.url, c.url], max_response_size=4096) as lm:
        assert await lm.discover() == [a.url, c.url, b.url]
        assert lm.leader == b.url
        assert lm._health[c.url].failures == 1 and a.url not in lm._health


async def test_skipped_entries_are_logged_once_per_problem_and_lookupd(
    lookupds: tuple[FakeApi, FakeApi, FakeApi], caplog: pytest.LogCaptureFixture
) -> None:
    a, _, _ = lookupds
    bad = {"broadcast_address": "10.0.0.9", "tcp_port": 0}
    a.routes["/listlookup"] = NO_LISTLOOKUP
    a.routes["/lookup"] = json_body({"producers": [bad, {"tcp_port": 1}, bad, node("10.0.0.1")]})
    caplog.set_level(logging.DEBUG, logger="smartnsq")
    async with LookupManager([a.url]) as lm:
        for _ in range(5):
            layout = await lm.lookup("t")
    assert [n.broadcast_address for n in layout.producers] == ["10.0.0.1"]
    assert len(a.calls("/lookup")) == 5
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # bad port, no address: each once
    assert any("tcp_port" in w for w in warnings) and any("address" in w for w in warnings)
    assert sum(r.levelno == logging.DEBUG and "skipped" in r.getMessage() for r in caplog.records)


async def test_a_lookupd_without_listlookup_is_not_asked_again(
    lookupds: tuple[FakeApi, FakeApi, FakeApi],
) -> None:
    a, _, _ = lookupds
    a.routes["/listlookup"] = NO_LISTLOOKUP
    async with LookupManager([a.url]) as lm:
        for _ in range(3):
            assert await lm.discover(force=True) == [a.url]
    assert len(a.calls("/listlookup")) == 1


class NoTrustStore(Exception):
    """Raised where the trust store would be loaded."""


@pytest.mark.parametrize("https", [False, True])
async def test_only_an_https_seed_loads_the_trust_store(
    lookupds: tuple[FakeApi, FakeApi, FakeApi], monkeypatch: pytest.MonkeyPatch, https: bool
) -> None:
    """Loading the trust store is 20-40 ms of every Consumer's and Producer's start; plain
    http lookupds (and the ones /listlookup adds, always http) never need it."""
    a, b, c = lookupds
    loaded: list[bool] = []

    def verify() -> Any:
        loaded.append(True)
        raise NoTrustStore

    monkeypatch.setattr(smartnsq.net.http, "tls_verify", verify)
    a.routes["/listlookup"] = json_body(listlookup(a.url, c.url))
    for lookupd in (a, b, c):
        lookupd.routes["/lookup"] = producers("10.0.0.1")
    secure = f"https://{unused_address()}"
    async with LookupManager([a.url, secure if https else b.url]) as lm:
        layout = await lm.lookup("t")
        assert [n.broadcast_address for n in layout.producers] == ["10.0.0.1"]
        assert (secure in lm._health) is https  # its request failed where the store loads
    assert bool(loaded) is https
    assert len(c.calls("/lookup")) == 1  # the lookupd /listlookup added was asked too


def nodes(ip: str, *topics: str) -> tuple[int, bytes]:
    """A classic ``/nodes`` answer: one nsqd carrying ``topics``."""
    return json_body({"producers": [{**node(ip), "topics": list(topics)}]})


async def test_nodes_answers_within_the_grace_are_merged(
    lookupds: tuple[FakeApi, FakeApi, FakeApi], caplog: pytest.LogCaptureFixture
) -> None:
    a, b, _ = lookupds
    a.routes["/listlookup"] = b.routes["/listlookup"] = NO_LISTLOOKUP
    a.routes["/nodes"] = nodes("10.0.0.1", "t1", "both")
    b.routes["/nodes"] = later(0.2, nodes("10.0.0.2", "t2", "both"))
    with caplog.at_level(logging.WARNING, logger="smartnsq"):
        async with LookupManager([a.url, b.url], timeout=5, answer_grace=2) as lm:
            found = await lm.every_topic()
    assert "ranked down" not in caplog.text  # slow but in time
    ips = {t: {n.broadcast_address for n in ns} for t, ns in found.items()}
    assert ips == {"t1": {"10.0.0.1"}, "t2": {"10.0.0.2"}, "both": {"10.0.0.1", "10.0.0.2"}}


async def test_a_slow_nodes_answer_costs_the_grace_not_the_timeout(
    lookupds: tuple[FakeApi, FakeApi, FakeApi],
) -> None:
    a, b, _ = lookupds
    a.routes["/listlookup"] = b.routes["/listlookup"] = NO_LISTLOOKUP
    # 200 bytes, one every 50 ms: 10 s in all, each read quick (never a read timeout)
    a.routes["/nodes"] = drip(200, 0.05)
    b.routes["/nodes"] = nodes("10.0.0.2", "t")
    async with LookupManager([a.url, b.url], timeout=5, answer_grace=0.1) as lm:
        await lm.discover()
        start = anyio.current_time()
        found = await lm.every_topic()
        assert anyio.current_time() - start < 2
        assert lm.ranked() == [b.url, a.url]  # late: ranked down, its answer not awaited
        assert lm.every_topic_at_once  # late is not a refusal: still one request a round
    assert [n.broadcast_address for n in found["t"]] == ["10.0.0.2"]
    assert len(a.calls("/nodes")) == 1


async def test_a_cancelled_refresh_leaves_its_followers_an_answer(
    lookupds: tuple[FakeApi, FakeApi, FakeApi],
) -> None:
    """The caller whose refresh others share is cancelled (its publish timed out, say): the
    others woke with neither a layout nor an error, and publish() raised a bare
    AssertionError. They look up themselves instead."""
    a, _, _ = lookupds
    a.routes["/listlookup"] = NO_LISTLOOKUP
    a.routes["/lookup"] = later(0.3, producers("10.0.0.1"))
    async with LookupManager([a.url]) as lm:
        await lm.discover()
        layouts = []

        async def follow() -> None:
            layouts.append(await lm.refresh("t", "w"))

        leader = anyio.CancelScope()

        async def lead() -> None:
            with leader:
                await lm.refresh("t", "w")

        async with anyio.create_task_group() as tg:
            tg.start_soon(lead)
            await anyio.wait_all_tasks_blocked()  # the leader waits for the slow lookupd
            tg.start_soon(follow)
            await anyio.wait_all_tasks_blocked()  # the follower waits for the leader's answer
            leader.cancel()
        assert [[n.broadcast_address for n in x.producers] for x in layouts] == [["10.0.0.1"]]
