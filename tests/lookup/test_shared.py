"""One lookupd poll per event loop (smartnsq.lookup.shared), against a real classic
nsqlookupd. A pass-through in front of it counts the requests by path; nothing is faked but
the refusal of ``/nodes`` in the fall-back test."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import pytest

from smartnsq import Consumer, Producer
from smartnsq.lookup.manager import LookupManager
from smartnsq.lookup.shared import BATCH_FROM, shared_lookup
from tests.helpers import (
    NOT_FOUND,
    FakeApi,
    HttpRequest,
    create_channel,
    fake_api,
    http_json,
    http_response,
    listed_producers,
    unique,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@asynccontextmanager
async def counted(lookupd: str, refuse_nodes: bool = False) -> AsyncIterator[FakeApi]:
    """A pass-through to the real ``lookupd`` that records every request."""
    async with fake_api() as api:

        async def forward(request: HttpRequest, stream: anyio.abc.ByteStream) -> None:
            query = urllib.parse.urlencode(request.query)
            url = f"http://{lookupd}{request.path}" + (f"?{query}" if query else "")
            status, body = await anyio.to_thread.run_sync(_get, url)
            await stream.send(http_response(status, body))

        for path in ("/lookup", "/listlookup", "/nodes"):
            api.routes[path] = forward
        if refuse_nodes:
            api.routes["/nodes"] = NOT_FOUND
        yield api


def registered(lookupd: str, topic: str, nsqd: Any) -> bool:
    port = int(nsqd.http.rsplit(":", 1)[1])
    return any(p["http_port"] == port for p in listed_producers(lookupd, topic))


async def consumers(
    stack: AsyncExitStack, topics: list[str], lookupd: str, **options: Any
) -> list[Consumer]:
    return [
        await stack.enter_async_context(
            Consumer(t, "c", lambda m: None, lookupd_http_addresses=[lookupd], **options)
        )
        for t in topics
    ]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_nodes_answers_what_lookup_answers_for_every_topic(cluster_factory, anyio_backend):
    cluster = cluster_factory("classic", nsqd=2)
    lookupd = cluster.lookupd[0].http
    n0, n1 = cluster.nsqd
    both, one, tombstoned = unique("both"), unique("one"), unique("tomb")
    for topic, nodes in ((both, (n0, n1)), (one, (n0,)), (tombstoned, (n0, n1))):
        for node in nodes:
            create_channel(node.http, topic, "c")
            await wait_until(lambda t=topic, n=node: registered(lookupd, t, n), 10, "registered")
    http_json(f"http://{lookupd}/topic/tombstone?topic={tombstoned}&node={n1.http}", "POST")
    async with LookupManager([lookupd]) as manager:
        await manager.discover()
        assert manager.every_topic_at_once  # a classic lookupd
        every = await manager.every_topic()
        for topic in (both, one, tombstoned):
            layout = await manager.lookup(topic)
            assert set(every[topic]) == set(layout.producers), topic
    assert {p.tcp_port for p in every[both]} == {int(n.tcp.rsplit(":", 1)[1]) for n in (n0, n1)}
    assert [p.tcp_port for p in every[tombstoned]] == [int(n0.tcp.rsplit(":", 1)[1])]
    assert unique("never") not in every


async def test_consumers_of_a_loop_share_one_round(cluster_factory, anyio_backend):
    cluster = cluster_factory("classic", nsqd=1)
    topics = [unique("share") for _ in range(BATCH_FROM + 1)]
    for t in topics:
        create_channel(cluster.nsqd[0].http, t, "c")
    async with counted(cluster.lookupd[0].http) as api, AsyncExitStack() as stack:
        cs = await consumers(
            stack, topics, api.address, lookupd_poll_interval=0.2, lookupd_poll_jitter=0.1
        )
        await wait_until(lambda: all(c.stats().connections == 1 for c in cs), 10, "subscribed")
        await wait_until(lambda: api.calls("/nodes"), 10, "a shared round")
        lookups, rounds = len(api.calls("/lookup")), len(api.calls("/nodes"))
        await wait_until(lambda: len(api.calls("/nodes")) >= rounds + 3, 10, "3 more rounds")
        # Three rounds for five consumers, one request each, and no topic asked on its own.
        assert len(api.calls("/lookup")) == lookups
        assert all(c.stats().connections == 1 for c in cs)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_shared_round_finds_new_nsqd_and_drops_tombstoned(cluster_factory, anyio_backend):
    cluster = cluster_factory("classic", nsqd=2)
    lookupd = cluster.lookupd[0].http
    n0, n1 = cluster.nsqd
    topics = [unique("found") for _ in range(BATCH_FROM)]
    for t in topics:
        create_channel(n0.http, t, "c")
    got: list[bytes] = []
    async with counted(lookupd) as api, AsyncExitStack() as stack:
        first = await stack.enter_async_context(
            Consumer(
                topics[0],
                "c",
                lambda m: got.append(m.body),
                lookupd_http_addresses=[api.address],
                lookupd_poll_interval=0.3,
                lookupd_poll_jitter=0.1,
            )
        )
        await consumers(
            stack, topics[1:], api.address, lookupd_poll_interval=0.3, lookupd_poll_jitter=0.1
        )
        await wait_until(lambda: api.calls("/nodes"), 10, "a shared round")
        lookups = len(api.calls("/lookup"))
        create_channel(n1.http, topics[0], "c")  # the topic appears on a second nsqd
        async with Producer([n1.tcp]) as producer:
            await producer.publish(topics[0], b"from n1")
        await wait_until(lambda: got == [b"from n1"], 10, "the message from the new nsqd")
        assert first.stats().connections == 2
        assert len(api.calls("/lookup")) == lookups  # found by the shared round
        http_json(f"http://{lookupd}/topic/tombstone?topic={topics[0]}&node={n0.http}", "POST")
        await wait_until(lambda: first.stats().connections == 1, 10, "the tombstoned nsqd dropped")


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_lookupd_refusing_nodes_is_asked_topic_by_topic(cluster_factory, anyio_backend):
    cluster = cluster_factory("classic", nsqd=2)
    n0, n1 = cluster.nsqd
    topics = [unique("refuse") for _ in range(BATCH_FROM)]
    for t in topics:
        create_channel(n0.http, t, "c")
    async with counted(cluster.lookupd[0].http, refuse_nodes=True) as api, AsyncExitStack() as s:
        cs = await consumers(s, topics, api.address, lookupd_poll_interval=0.3)
        await wait_until(lambda: api.calls("/nodes"), 10, "a shared round tried")
        create_channel(n1.http, topics[-1], "c")
        await wait_until(lambda: cs[-1].stats().connections == 2, 10, "the new nsqd found")
        lookups = len(api.calls("/lookup"))
        await wait_until(lambda: len(api.calls("/lookup")) >= lookups + 2 * len(topics), 10, "")
        assert len(api.calls("/nodes")) == 1  # refused once: never asked again


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_one_shared_state_per_lookupds_and_settings(anyio_backend):
    async with (
        shared_lookup(["127.0.0.1:1"], "a", interval=60, jitter=0.3) as a,
        shared_lookup(["127.0.0.1:1"], "b", interval=60, jitter=0.3) as b,
        shared_lookup(["127.0.0.1:1"], "b", interval=30, jitter=0.3) as other,
    ):
        assert a is b and a is not other
        assert dict(a.topics) == {"a": 1, "b": 1}
        assert not a.batched  # two topics, and not yet known to be classic
    async with shared_lookup(["127.0.0.1:1"], "a", interval=60, jitter=0.3) as again:
        assert again is not a and dict(again.topics) == {"a": 1}
