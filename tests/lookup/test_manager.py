"""LookupManager edge cases with mocked lookupds (respx): discovery, ranking, merging."""

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
    import anyio

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
