"""The start plan and stats reading against a small fake nsqd HTTP API: answers a real nsqd
gives only in rare moments (a failing setoffset, a channel lagging its topic)."""

from __future__ import annotations

import json

import anyio.abc
import pytest

from smartnsq.errors import NsqdHttpFailed
from smartnsq.lookup.model import Node
from smartnsq.net.http import HttpClient
from smartnsq.offsets import StartPlan, read_partition
from smartnsq.protocol.offsets import Skip, check_start
from tests.helpers import fake_http, http_response

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


def stats(channel_count: int = 10, clients: int = 1) -> bytes:
    return json.dumps(
        {
            "topics": [
                {
                    "topic_name": "t",
                    "topic_partition": "0",
                    "is_leader": True,
                    "backend_start": 0,
                    "backend_depth": 320,
                    "message_count": 10,
                    "channels": [
                        {
                            "channel_name": "ch",
                            "message_count": channel_count,
                            "depth": 4,
                            "depth_size": 128,
                            "client_num": clients,
                        }
                    ],
                }
            ]
        }
    ).encode()


def node(address: str) -> Node:
    host, port = address.rsplit(":", 1)
    return Node(host, 4150, int(port))


async def test_a_failed_setoffset_leaves_the_start_pending(anyio_backend: str) -> None:
    paths: list[str] = []
    failures = [1]

    async def respond(path: str, stream: anyio.abc.ByteStream) -> None:
        paths.append(path)
        if path.startswith("/stats"):
            await stream.send(http_response(200, stats()))
        elif failures and failures.pop():
            await stream.send(http_response(500, b'{"message":"E_FAILED"}'))
        else:
            await stream.send(http_response(200, b""))

    plan = StartPlan("t", "ch", check_start("latest"), None, ["127.0.0.1:1"])
    async with fake_http(respond) as address:
        assert plan.pending(0)
        with pytest.raises(NsqdHttpFailed, match="500"):
            await plan.apply(0, node(address), True)
        assert plan.pending(0)  # the next subscription tries again
        # 4 messages waiting: nsqd held the one at the channel's position (192) ready
        assert await plan.apply(0, node(address), True) == Skip(320, at=320, held=192)
        assert not plan.pending(0)  # applied once: a reconnect does not move the channel
    setoffsets = [p for p in paths if p.startswith("/channel/setoffset")]
    assert len(setoffsets) == 2
    assert "partition=0" in setoffsets[0] and "channel=ch" in setoffsets[0]


async def test_a_channel_with_other_clients_is_not_moved(anyio_backend: str) -> None:
    paths: list[str] = []

    async def respond(path: str, stream: anyio.abc.ByteStream) -> None:
        paths.append(path)
        await stream.send(http_response(200, stats(clients=2)))

    plan = StartPlan("t", "ch", check_start("earliest"), None, ["127.0.0.1:1"])
    async with fake_http(respond) as address:
        assert await plan.apply(0, node(address), False) is None
    assert not plan.pending(0)
    assert not [p for p in paths if p.startswith("/channel/setoffset")]


async def test_stats_wait_for_the_channel_to_catch_up_with_its_topic(anyio_backend: str) -> None:
    answers = [stats(channel_count=9), stats(channel_count=9), stats()]

    async def respond(path: str, stream: anyio.abc.ByteStream) -> None:
        await stream.send(http_response(200, answers.pop(0)))

    async with fake_http(respond) as address:
        offsets = await read_partition(HttpClient(), "t", 0, node(address), "ch")
    assert not answers
    assert (offsets.channel, offsets.depth, offsets.channel_count) == (192, 4, 6)
    assert (offsets.earliest, offsets.end, offsets.end_count) == (0, 320, 10)


@pytest.mark.parametrize("published", [0, 10])
async def test_end_of_file_means_nothing_to_move_only_on_an_empty_partition(
    anyio_backend: str, published: int
) -> None:
    """The fork answers a move on a partition nothing was published to with HTTP 500
    "commit log end of file"; on a partition that holds messages it is a failure."""
    topic = json.loads(stats())
    entry = topic["topics"][0]
    entry["backend_depth"], entry["message_count"] = 32 * published, published
    entry["channels"][0].update(message_count=entry["message_count"], depth=0, depth_size=0)

    async def respond(path: str, stream: anyio.abc.ByteStream) -> None:
        if path.startswith("/stats"):
            await stream.send(http_response(200, json.dumps(topic).encode()))
        else:
            await stream.send(http_response(500, b'{"message":"commit log end of file"}'))

    plan = StartPlan("t", "ch", check_start(1_700_000_000), None, ["127.0.0.1:1"])
    async with fake_http(respond) as address:
        if published:
            with pytest.raises(NsqdHttpFailed, match="commit log end of file"):
                await plan.apply(0, node(address), True)
            assert plan.pending(0)
        else:
            assert await plan.apply(0, node(address), True) is None
            assert not plan.pending(0)
