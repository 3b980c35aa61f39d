"""LookupManager edge cases with mocked lookupds (respx): discovery, ranking, merging."""

import logging

import anyio
import httpx
import pytest
import respx

from smartnsq.errors import LookupFailed, TopicNotFound
from smartnsq.lookup.manager import LookupManager

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

A, B, C = "http://a.test:4161", "http://b.test:4161", "http://c.test:4161"


def node(ip: str, port: int = 4150) -> dict:
    return {"broadcast_address": ip, "tcp_port": port, "http_port": port + 1}


def listlookup(*urls: str, leader: str | None = None) -> dict:
    def entry(url: str) -> dict:
        host, port = url.removeprefix("http://").split(":")
        return {"ID": url, "NodeIP": host, "TcpPort": "4160", "HttpPort": port, "RpcPort": "1"}

    return {
        "lookupdnodes": [entry(u) for u in urls],
        "lookupdleader": entry(leader) if leader else {"ID": "", "NodeIP": "", "HttpPort": ""},
    }


@respx.mock
async def test_listlookup_expands_seeds_and_finds_leader(anyio_backend):
    respx.get(f"{A}/listlookup").mock(
        return_value=httpx.Response(200, json=listlookup(A, B, leader=B))
    )
    async with LookupManager([A]) as lm:
        assert await lm.discover() == [A, B]
        assert lm.leader == B


@respx.mock
@pytest.mark.parametrize(
    "response",
    [httpx.Response(404), httpx.Response(200, content=b""), httpx.Response(200, text="{bad")],
)
async def test_classic_or_odd_listlookup_uses_the_seed(anyio_backend, response):
    respx.get(f"{A}/listlookup").mock(return_value=response)
    async with LookupManager([A]) as lm:
        assert await lm.discover() == [A]


@respx.mock
async def test_failed_lookupd_is_ranked_down_and_recovers(anyio_backend):
    respx.get(f"{A}/listlookup").mock(return_value=httpx.Response(404))
    respx.get(f"{B}/listlookup").mock(return_value=httpx.Response(404))
    a = respx.get(f"{A}/lookup").mock(side_effect=httpx.ConnectError("down"))
    respx.get(f"{B}/lookup").mock(
        return_value=httpx.Response(200, json={"producers": [node("10.0.0.2")]})
    )
    async with LookupManager([A, B], max_backoff=0) as lm:  # back-off expires at once
        layout = await lm.lookup("t")
        assert [n.broadcast_address for n in layout.producers] == ["10.0.0.2"]
        assert lm.ranked() == [B, A]
        a.mock(return_value=httpx.Response(200, json={"producers": [node("10.0.0.1")]}))
        layout = await lm.lookup("t")
        assert {n.broadcast_address for n in layout.producers} == {"10.0.0.1", "10.0.0.2"}
        assert A in lm.ranked()[:2] and not lm._health[A].failures  # recovered


@respx.mock
async def test_all_down_raises_lookup_failed(anyio_backend):
    respx.get(f"{A}/listlookup").mock(side_effect=httpx.ConnectTimeout("slow"))
    respx.get(f"{A}/lookup").mock(return_value=httpx.Response(500, text="boom"))
    async with LookupManager([A]) as lm:
        with pytest.raises(LookupFailed, match="no lookupd answered"):
            await lm.lookup("t")


@respx.mock
async def test_write_lookup_404_is_topic_not_found_read_is_empty(anyio_backend):
    respx.get(f"{A}/listlookup").mock(return_value=httpx.Response(404))
    respx.get(f"{A}/lookup").mock(
        return_value=httpx.Response(404, json={"message": "Key not found"})
    )
    async with LookupManager([A]) as lm:
        with pytest.raises(TopicNotFound):
            await lm.lookup("t", "w")
        layout = await lm.lookup("t", "r")
        assert not layout.producers and not layout.partitions


@respx.mock
async def test_partitions_merge_prefers_the_leader(anyio_backend):
    respx.get(f"{A}/listlookup").mock(
        return_value=httpx.Response(200, json=listlookup(A, B, leader=B))
    )
    stale = {"partitions": {"0": node("10.0.0.1"), "1": node("10.0.0.1")}, "producers": []}
    fresh = {"partitions": {"0": node("10.0.0.2")}, "producers": [node("10.0.0.2")]}
    respx.get(f"{A}/lookup").mock(return_value=httpx.Response(200, json=stale))
    respx.get(f"{B}/lookup").mock(return_value=httpx.Response(200, json=fresh))
    async with LookupManager([A]) as lm:
        layout = await lm.lookup("t")
    assert layout.partitions[0].broadcast_address == "10.0.0.2"  # leader's answer wins
    assert layout.partitions[1].broadcast_address == "10.0.0.1"  # union of the rest


@respx.mock
async def test_refresh_is_rate_limited_and_shared(anyio_backend):
    respx.get(f"{A}/listlookup").mock(return_value=httpx.Response(404))
    route = respx.get(f"{A}/lookup").mock(
        return_value=httpx.Response(200, json={"producers": [node("10.0.0.1")]})
    )
    async with LookupManager([A], min_refresh_interval=60) as lm:
        async with anyio.create_task_group() as tg:
            for _ in range(100):
                tg.start_soon(lm.refresh, "t", "w")
        assert route.call_count == 1
        await lm.refresh("t", "w")
        assert route.call_count == 1  # still within min_refresh_interval


@respx.mock
async def test_sends_accept_header_and_metainfo(anyio_backend):
    respx.get(f"{A}/listlookup").mock(return_value=httpx.Response(404))
    route = respx.get(f"{A}/lookup").mock(return_value=httpx.Response(200, json={"producers": []}))
    async with LookupManager([A]) as lm:
        await lm.lookup("t", "w")
    request = route.calls.last.request
    assert request.headers["accept"] == "application/vnd.nsq; version=1.0"
    assert request.url.params["access"] == "w" and request.url.params["metainfo"] == "true"


@respx.mock
async def test_cached_answer_expires_so_producers_poll(anyio_backend):
    respx.get(f"{A}/listlookup").mock(return_value=httpx.Response(404))
    respx.get(f"{A}/lookup").mock(
        return_value=httpx.Response(200, json={"producers": [node("10.0.0.1")]})
    )
    async with LookupManager([A], cache_ttl=60) as lm:
        await lm.lookup("t", "w")
        assert lm.cached("t", "w") is not None
    async with LookupManager([A], cache_ttl=1e-9, cache_jitter=0) as lm:
        await lm.lookup("t", "w")
        assert lm.cached("t", "w") is None  # expired: the next publish looks up again


def drip_response() -> httpx.Response:
    """200 whose body comes one byte at a time, each read quick: never a read timeout."""

    async def body():
        for _ in range(200):
            yield b" "
            await anyio.sleep(0.05)

    return httpx.Response(200, content=body())


def answers(layout_body: dict) -> httpx.Response:
    return httpx.Response(200, json=layout_body)


@respx.mock
async def test_slow_lookupd_costs_the_grace_not_the_timeout(anyio_backend):
    respx.get(f"{A}/listlookup").mock(side_effect=lambda request: drip_response())
    respx.get(f"{B}/listlookup").mock(return_value=httpx.Response(404))
    respx.get(f"{A}/lookup").mock(side_effect=lambda request: drip_response())
    respx.get(f"{B}/lookup").mock(return_value=answers({"producers": [node("10.0.0.2")]}))
    async with LookupManager([A, B], timeout=5, answer_grace=0.1) as lm:
        start = anyio.current_time()
        assert await lm.discover() == [A, B]
        assert anyio.current_time() - start < 2
        assert lm._health[A].failures == 1  # late: ranked down
        lm._health[A].retry_at = 0  # ask it again at once
        start = anyio.current_time()
        layout = await lm.lookup("t")
        assert anyio.current_time() - start < 2
        assert [n.broadcast_address for n in layout.producers] == ["10.0.0.2"]
        assert lm._health[A].failures == 2 and lm.ranked() == [B, A]


@respx.mock
async def test_an_empty_answer_does_not_start_the_grace(anyio_backend):
    async def later(request: httpx.Request) -> httpx.Response:
        await anyio.sleep(0.3)
        return answers({"producers": [node("10.0.0.2")]})

    respx.get(f"{A}/listlookup").mock(return_value=httpx.Response(404))
    respx.get(f"{B}/listlookup").mock(return_value=httpx.Response(404))
    respx.get(f"{A}/lookup").mock(return_value=answers({"producers": []}))
    respx.get(f"{B}/lookup").mock(side_effect=later)
    async with LookupManager([A, B], answer_grace=0.01) as lm:
        layout = await lm.lookup("t")
    assert [n.broadcast_address for n in layout.producers] == ["10.0.0.2"]


@respx.mock
async def test_answers_within_the_grace_are_merged(anyio_backend):
    async def later(request: httpx.Request) -> httpx.Response:
        await anyio.sleep(0.1)
        return answers({"producers": [node("10.0.0.2")]})

    respx.get(f"{A}/listlookup").mock(return_value=httpx.Response(404))
    respx.get(f"{B}/listlookup").mock(return_value=httpx.Response(404))
    respx.get(f"{A}/lookup").mock(return_value=answers({"producers": [node("10.0.0.1")]}))
    respx.get(f"{B}/lookup").mock(side_effect=later)
    async with LookupManager([A, B], answer_grace=2) as lm:
        layout = await lm.lookup("t")
    assert {n.broadcast_address for n in layout.producers} == {"10.0.0.1", "10.0.0.2"}


@respx.mock
async def test_unexpected_error_is_that_lookupds_failure(anyio_backend):
    respx.get(f"{A}/listlookup").mock(side_effect=RuntimeError("bug in a transport"))
    respx.get(f"{B}/listlookup").mock(return_value=httpx.Response(404))
    respx.get(f"{A}/lookup").mock(side_effect=RecursionError("deep"))
    respx.get(f"{B}/lookup").mock(return_value=answers({"producers": [node("10.0.0.2")]}))
    async with LookupManager([A, B], max_backoff=0) as lm:
        layout = await lm.lookup("t")
        assert [n.broadcast_address for n in layout.producers] == ["10.0.0.2"]
        assert lm._health[A].failures == 2  # /listlookup and /lookup
    async with LookupManager([A]) as lm:
        with pytest.raises(LookupFailed, match="RecursionError"):
            await lm.refresh("t", "w")
        with pytest.raises(LookupFailed, match="RecursionError"):
            await lm.lookup("t")


@respx.mock
async def test_listlookup_is_capped_and_bad_nodes_skipped(anyio_backend):
    body = listlookup(A, B, leader=B)
    body["lookupdnodes"].append({"NodeIP": "10.0.0.9", "HttpPort": "0"})
    respx.get(f"{A}/listlookup").mock(return_value=answers(body))
    respx.get(f"{C}/listlookup").mock(return_value=httpx.Response(200, content=b" " * 5000))
    async with LookupManager([A, C], max_response_size=4096) as lm:
        assert await lm.discover() == [A, C, B]
        assert lm.leader == B
        assert lm._health[C].failures == 1 and A not in lm._health


@respx.mock
async def test_skipped_entries_are_logged_once_per_problem_and_lookupd(anyio_backend, caplog):
    bad = {"broadcast_address": "10.0.0.9", "tcp_port": 0}
    respx.get(f"{A}/listlookup").mock(return_value=httpx.Response(404))
    respx.get(f"{A}/lookup").mock(
        return_value=answers({"producers": [bad, {"tcp_port": 1}, bad, node("10.0.0.1")]})
    )
    caplog.set_level(logging.DEBUG, logger="smartnsq")
    async with LookupManager([A]) as lm:
        for _ in range(5):
            layout = await lm.lookup("t")
    assert [n.broadcast_address for n in layout.producers] == ["10.0.0.1"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # bad port, no address: each once
    assert any("tcp_port" in w for w in warnings) and any("address" in w for w in warnings)
    assert sum(r.levelno == logging.DEBUG and "skipped" in r.getMessage() for r in caplog.records)


@respx.mock
async def test_a_lookupd_without_listlookup_is_not_asked_again(anyio_backend):
    listing = respx.get(f"{A}/listlookup").mock(return_value=httpx.Response(404))
    async with LookupManager([A]) as lm:
        for _ in range(3):
            assert await lm.discover(force=True) == [A]
    assert listing.call_count == 1


@pytest.mark.parametrize(
    ("seeds", "loads"), [([A, B], False), ([A, "https://secure.test:4162"], True)]
)
async def test_only_an_https_seed_loads_the_trust_store(anyio_backend, monkeypatch, seeds, loads):
    """Loading the trust store is 20-40 ms of every Consumer's and Producer's start; plain
    http lookupds (and the ones /listlookup adds, always http) never need it."""
    import smartnsq.lookup.manager as manager

    loaded: list[bool] = []

    def verify() -> object:
        loaded.append(True)
        return True

    monkeypatch.setattr(manager, "tls_verify", verify)
    async with LookupManager(seeds):
        pass
    assert bool(loaded) is loads
