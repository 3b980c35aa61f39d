"""How far a channel is behind its topic: the messages it has not consumed yet.

On a Youzan HA cluster that is, per partition, the partition's end minus the channel's
consumed position (both message counts, from the partition leader's ``/stats``), each
partition once however it was found (lookupd, nsqd addresses, or both). On classic
nsqd it is, per nsqd, the channel's ``depth`` (waiting in memory and on disk) plus its
``in_flight_count`` and ``deferred_count`` (delivered or requeued, not finished), from that
nsqd's ``/stats``. Neither is a live count: it is what nsqd said at the moment of asking.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from smartnsq._checks import check_addresses, check_number
from smartnsq.errors import InvalidArgument, NsqdHttpFailed, NSQError, NSQTimeout, ProtocolError
from smartnsq.lookup.client import ACCEPT, check_lookupd_addresses
from smartnsq.lookup.manager import LookupManager
from smartnsq.lookup.model import Node, loads, unwrap
from smartnsq.net.http import HttpClient, HttpError
from smartnsq.offsets import http_address, read_partition
from smartnsq.protocol.names import validate_channel, validate_topic
from smartnsq.protocol.offsets import parse_partition_stats

__all__ = ["ChannelLag", "channel_lag", "consumer_lag"]

log = logging.getLogger("smartnsq.lag")

MAX_ANSWER = 16 << 20  # /stats filtered to one topic and channel is a few kilobytes


@dataclass(frozen=True)
class ChannelLag:
    """The lag of a channel on one nsqd (classic) or one partition (Youzan).

    Attributes:
        topic: The topic.
        channel: The channel.
        nsqd: HTTP address (``host:port``) of the nsqd that was asked.
        partition: The Youzan partition; None on classic nsqd.
        messages: Messages the channel has not consumed yet; None when it could not be told
            (the channel or topic does not exist there, or the nsqd did not answer: see
            ``error``).
        error: Why ``messages`` is None after a failed request, else None.
    """

    topic: str
    channel: str
    nsqd: str
    partition: int | None
    messages: int | None
    error: str | None = None


async def channel_lag(
    topic: str,
    channel: str,
    *,
    lookupd_http_addresses: Sequence[str] = (),
    nsqd_http_addresses: Sequence[str] = (),
    timeout: float = 10.0,
) -> list[ChannelLag]:
    """The lag of ``channel`` on every nsqd (and Youzan partition) that holds ``topic``.

    Args:
        topic: The topic.
        channel: The channel.
        lookupd_http_addresses: Find the topic's nsqd (or partition leaders) through these.
        nsqd_http_addresses: nsqd HTTP addresses (``host:port``) to ask as well: a classic
            nsqd gives one figure, a Youzan one a figure per partition it leads.
        timeout: Seconds for the whole call.

    Returns:
        One :class:`ChannelLag` per nsqd (classic) or partition (Youzan), sorted by nsqd and
        partition. An nsqd that fails gives an entry with ``messages=None`` and ``error``:
        one bad node does not hide the others.

    Raises:
        InvalidArgument: A bad name, address or timeout, or no address at all (nothing was
            asked).
        LookupFailed: No lookupd answered.
        NsqdHttpFailed: Every nsqd asked failed.
        NSQTimeout: It took longer than ``timeout``.
    """
    topic = validate_topic(topic)
    channel = validate_channel(channel)
    lookupds = check_lookupd_addresses(
        check_addresses("lookupd_http_addresses", lookupd_http_addresses)
    )
    nsqds = check_addresses("nsqd_http_addresses", nsqd_http_addresses)
    if not lookupds and not nsqds:
        raise InvalidArgument(
            "channel_lag needs lookupd_http_addresses or nsqd_http_addresses (or both)"
        )
    check_number("timeout", timeout, above=0)
    results: list[ChannelLag] = []
    with anyio.move_on_after(timeout):
        client = HttpClient(connect_timeout=min(2.0, timeout))
        classic: dict[str, None] = dict.fromkeys(nsqds)
        partitions: dict[int, Node] = {}
        if lookupds:
            async with LookupManager(lookupds, timeout=min(timeout, 5.0)) as manager:
                layout = await manager.lookup(topic, "r")
            partitions = dict(layout.partitions)
            if not partitions:
                classic.update(dict.fromkeys(http_address(n) for n in layout.producers))

        asked: list[ChannelLag] = []

        async def youzan(partition: int, node: Node) -> None:
            results.append(await _partition_lag(client, topic, channel, partition, node))

        async def one(address: str) -> None:
            asked.extend(await _nsqd_lag(client, topic, channel, address))

        async with anyio.create_task_group() as tg:
            for partition, node in partitions.items():
                tg.start_soon(youzan, partition, node)
            for address in classic:
                tg.start_soon(one, address)
        # Each partition once: lookupd's leader first, then a leader's answer, then any.
        covered = {r.partition for r in results}
        for r in sorted(asked, key=lambda r: r.messages is None):
            if r.partition is None or r.partition not in covered:
                results.append(r)
                covered.add(r.partition)
        if results and all(r.error is not None for r in results):
            raise NsqdHttpFailed(
                f"no nsqd told the lag of {topic}/{channel}: "
                + "; ".join(f"{r.nsqd}: {r.error}" for r in results)
            )
        return sorted(results, key=lambda r: (r.nsqd, -1 if r.partition is None else r.partition))
    raise NSQTimeout(f"the lag of {topic}/{channel} took longer than {timeout}s")


async def consumer_lag(
    topic: str,
    channel: str,
    lookupds: Sequence[str],
    nsqd_http_addresses: Sequence[str],
    timeout: float,
) -> list[ChannelLag]:
    """A consumer's lag (``Consumer.lag``): through its lookupds, or the nsqd HTTP addresses
    its caller gives, since a consumer of nsqd TCP addresses cannot tell their HTTP ports.

    Args:
        topic: The consumer's topic.
        channel: The consumer's channel.
        lookupds: The consumer's lookupd HTTP addresses.
        nsqd_http_addresses: nsqd HTTP addresses to ask as well.
        timeout: Seconds for the whole call.

    Returns:
        What :func:`channel_lag` returns.

    Raises:
        InvalidArgument: Neither lookupds nor nsqd HTTP addresses.
    """
    if not lookupds and not nsqd_http_addresses:
        raise InvalidArgument(
            "this Consumer reads nsqd_tcp_addresses without a lookupd: pass lag() their "
            "nsqd_http_addresses (a TCP connection does not tell nsqd's HTTP port)"
        )
    return await channel_lag(
        topic,
        channel,
        lookupd_http_addresses=lookupds,
        nsqd_http_addresses=nsqd_http_addresses,
        timeout=timeout,
    )


async def _partition_lag(
    client: HttpClient, topic: str, channel: str, partition: int, node: Node
) -> ChannelLag:
    http = http_address(node)
    try:
        p = await read_partition(client, topic, partition, node, channel)
    except NSQError as exc:
        return ChannelLag(topic, channel, http, partition, None, str(exc))
    if p.channel_count is None or p.end_count is None:
        return ChannelLag(topic, channel, http, partition, None)
    return ChannelLag(topic, channel, http, partition, max(0, p.end_count - p.channel_count))


async def _nsqd_lag(client: HttpClient, topic: str, channel: str, address: str) -> list[ChannelLag]:
    """The lag an nsqd's ``/stats`` tells: one entry for classic nsqd, one per partition for
    the fork's (its leader's numbers; a replica's are marked as not told)."""
    url = f"http://{address}/stats"
    params = {"format": "json", "topic": topic, "channel": channel}
    try:
        r = await client.get(url, params, ACCEPT, max_size=MAX_ANSWER)
        if r.status != 200:
            text = r.body[:200].decode("utf-8", "replace")
            raise NsqdHttpFailed(f"HTTP {r.status}: {text}")
        stats = unwrap(loads(r.body))
        partitions = fork_partitions(stats, topic)
        if partitions:
            return [_fork_lag(stats, topic, channel, address, p) for p in partitions]
        lag = classic_lag(stats, topic, channel)
    except (HttpError, NsqdHttpFailed, ValueError, RecursionError, ProtocolError) as exc:
        return [ChannelLag(topic, channel, address, None, None, f"{exc!s:.200}")]
    return [ChannelLag(topic, channel, address, None, lag)]


def fork_partitions(stats: Any, topic: str) -> list[int]:
    """The partitions of ``topic`` in a Youzan nsqd's ``/stats`` answer (none on classic
    nsqd, whose topics have no ``topic_partition``)."""
    found = set()
    topics = stats.get("topics") if isinstance(stats, dict) else None
    for t in topics if isinstance(topics, list) else ():
        if isinstance(t, dict) and t.get("topic_name") == topic:
            part = t.get("topic_partition")
            if isinstance(part, str) and part.isdigit():
                found.add(int(part))
    return sorted(found)


def _fork_lag(stats: Any, topic: str, channel: str, address: str, partition: int) -> ChannelLag:
    """One partition's lag from its leader's ``/stats``: the messages the channel has not
    seen yet plus its depth (which on the fork counts those in flight)."""
    n = parse_partition_stats(stats, topic, partition, channel)
    if n is not None and not n.leader:
        error = f"nsqd {address} holds a replica of partition {partition}, not its leader"
        return ChannelLag(topic, channel, address, partition, None, error)
    if n is None or n.channel_count is None:
        return ChannelLag(topic, channel, address, partition, None)
    return ChannelLag(topic, channel, address, partition, max(0, n.end_count - n.channel_count))


def classic_lag(stats: Any, topic: str, channel: str) -> int | None:
    """``depth + in_flight_count + deferred_count`` of ``topic/channel`` in a classic nsqd's
    ``/stats`` answer; None when that nsqd has no such channel. ValueError when the answer
    is not nsqd's stats."""
    # A filter that matches no topic: nsqd answers "topics": null.
    if not isinstance(stats, dict) or not isinstance(stats.get("topics", ()), list | None):
        raise ValueError("not an nsqd /stats answer (no topics list)")
    if "topics" not in stats and "version" not in stats:
        raise ValueError("not an nsqd /stats answer (no topics list)")
    for t in stats.get("topics") or ():
        if not isinstance(t, dict) or t.get("topic_name") != topic:
            continue
        for c in t.get("channels") or ():
            if isinstance(c, dict) and c.get("channel_name") == channel:
                return sum(_count(c, k) for k in ("depth", "in_flight_count", "deferred_count"))
    return None


def _count(entry: dict[str, Any], key: str) -> int:
    value = entry.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key} is not a count: {value!r}")
    return value
