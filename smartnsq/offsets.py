"""Reading positions of a Youzan partitioned topic, and moving a consumer's start.

Units: a *queue offset* is a message's byte position in its partition's disk queue, what the
fork delivers with each ``SUB_ORDERED``/``SUB_ADVANCED`` message (:attr:`Message.offset`)
and what ``/channel/setoffset`` accepts as ``virtual_queue:<offset>``. The next message of a
partition is at ``offset + raw_size``. A *message count* counts messages from the start of the
partition (the first message is count 0).

The numbers come from each partition leader's ``/stats?format=json``: the topic's
``backend_start`` (earliest), ``backend_depth`` (end) and ``message_count`` (end count), and
for a channel its ``depth`` (unfinished messages) and ``depth_size`` (their bytes).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import anyio

from smartnsq._checks import check_addresses, check_bool, check_number
from smartnsq.errors import (
    InvalidArgument,
    LookupFailed,
    NotSupported,
    NsqdHttpFailed,
    NSQTimeout,
    OffsetOutOfRange,
    ProtocolError,
    TopicNotFound,
)
from smartnsq.lookup.client import ACCEPT, check_lookupd_addresses
from smartnsq.lookup.manager import LookupManager
from smartnsq.lookup.model import Node, TopicLayout, loads
from smartnsq.net.http import HttpClient, HttpError, Response, TooLarge
from smartnsq.protocol.names import validate_channel, validate_topic
from smartnsq.protocol.offsets import (
    PartitionNumbers,
    Skip,
    Start,
    StartAt,
    check_partitions,
    check_start,
    nothing_to_move,
    parse_partition_stats,
    setoffset_body,
    skip_for,
    start_offset,
)

log = logging.getLogger("smartnsq.offsets")

REQUEST_TIMEOUT = 10.0  # one nsqd HTTP request
MAX_ANSWER = 16 << 20  # a /stats answer for one topic and partition is a few kilobytes

# How long a channel's end may lag its topic's: SETTLE_TRIES reads, SETTLE_PAUSE apart.
SETTLE_TRIES = 40
SETTLE_PAUSE = 0.025


@dataclass(frozen=True)
class PartitionOffsets:
    """Where one partition of a Youzan topic stands (see :func:`partition_offsets`).

    Attributes:
        topic: The topic.
        partition: The partition number.
        nsqd: TCP address (``host:port``) of the partition's leader nsqd.
        http: HTTP address (``host:port``) of the same nsqd.
        earliest: Queue offset of the earliest retained message.
        end: Queue offset just past the last message: where the next one goes. The partition
            holds ``end - earliest`` bytes of messages; ``earliest == end`` when it is empty.
        earliest_count: Message count at ``earliest``, when the fork tells it (it does only
            while nothing was cleaned up: then 0), else None.
        end_count: Messages published to the partition so far (the count at ``end``).
        channel: The channel's confirmed queue offset: every message before it is finished
            (it is where the channel resumes). None without a channel or when the channel
            does not exist on the partition.
        depth: Messages of the channel not finished yet (waiting or in flight). None as above.
        channel_count: Message count at ``channel`` (``end_count - depth``). None as above.
    """

    topic: str
    partition: int
    nsqd: str
    http: str
    earliest: int
    end: int
    earliest_count: int | None
    end_count: int | None
    channel: int | None
    depth: int | None
    channel_count: int | None = None


async def partition_offsets(
    topic: str,
    *,
    lookupd_http_addresses: Sequence[str],
    channel: str | None = None,
    timeout: float = 10.0,
) -> list[PartitionOffsets]:
    """Offsets of every partition of a Youzan topic, sorted by partition.

    Asks lookupd for the partitions' leaders, then each leader's ``/stats``.

    Args:
        topic: A topic of a Youzan HA cluster.
        lookupd_http_addresses: nsqlookupd HTTP addresses (``host:port``).
        channel: Also report this channel's position (``channel``, ``depth``).
        timeout: Seconds for the whole call.

    Returns:
        One :class:`PartitionOffsets` per partition, sorted by partition.

    Raises:
        InvalidArgument: A bad topic, channel, address or timeout (nothing was asked).
        NotSupported: The cluster is classic nsqd, which has no partitions or offsets.
        TopicNotFound: No lookupd knows the topic.
        LookupFailed: No lookupd answered.
        NsqdHttpFailed: A partition leader's ``/stats`` failed.
        NSQTimeout: It took longer than ``timeout``.
    """
    topic = validate_topic(topic)
    if channel is not None:
        channel = validate_channel(channel)
    lookupds = _lookupds(lookupd_http_addresses)
    check_number("timeout", timeout, above=0)
    with anyio.move_on_after(timeout):
        async with LookupManager(lookupds, timeout=min(timeout, 5.0)) as manager:
            layout = await manager.lookup(topic, "r")
            leaders = partition_leaders(topic, layout)
            client = manager.client
            results: dict[int, PartitionOffsets] = {}

            async def one(partition: int, node: Node) -> None:
                results[partition] = await read_partition(client, topic, partition, node, channel)

            async with anyio.create_task_group() as tg:
                for partition, node in leaders.items():
                    tg.start_soon(one, partition, node)
            return [results[p] for p in sorted(results)]
    raise NSQTimeout(f"partition offsets of {topic!r} took longer than {timeout}s")


def _lookupds(addresses: Sequence[str]) -> list[str]:
    lookupds = check_lookupd_addresses(check_addresses("lookupd_http_addresses", addresses))
    if not lookupds:
        raise InvalidArgument("lookupd_http_addresses is empty: give at least one nsqlookupd")
    return lookupds


def partition_leaders(topic: str, layout: TopicLayout) -> dict[int, Node]:
    """The leader of each partition; NotSupported on a classic cluster."""
    if not layout.partitions:
        if layout.producers:
            raise NotSupported(
                f"topic {topic!r} has no partitions: offsets and start positions need a "
                "Youzan HA cluster (classic nsqd has no queue offsets)"
            )
        raise TopicNotFound(f"no lookupd knows topic {topic!r}")
    return dict(layout.partitions)


def http_address(node: Node) -> str:
    if not node.http_port:
        raise LookupFailed(f"lookupd gave no HTTP port for nsqd {node.tcp_address}")
    host = node.broadcast_address
    return f"[{host}]:{node.http_port}" if ":" in host else f"{host}:{node.http_port}"


async def _request(
    client: HttpClient,
    method: str,
    url: str,
    params: dict[str, str],
    body: bytes | None = None,
) -> bytes:
    return _ok(url, await _answer(client, method, url, params, body))


def _ok(url: str, r: Response) -> bytes:
    if r.status != 200:
        text = r.body[:200].decode("utf-8", "replace")
        raise NsqdHttpFailed(f"nsqd {url} answered HTTP {r.status}: {text}")
    return r.body


async def _answer(
    client: HttpClient,
    method: str,
    url: str,
    params: dict[str, str],
    body: bytes | None = None,
) -> Response:
    with anyio.move_on_after(REQUEST_TIMEOUT):
        try:
            return await client.request(method, url, params, ACCEPT, body, max_size=MAX_ANSWER)
        except TooLarge:
            raise NsqdHttpFailed(f"nsqd {url} sent more than {MAX_ANSWER} bytes") from None
        except HttpError as exc:
            raise NsqdHttpFailed(f"nsqd {url} failed: {exc}") from exc
    raise NsqdHttpFailed(f"nsqd {url} did not answer within {REQUEST_TIMEOUT}s")


async def stats(
    client: HttpClient, topic: str, partition: int, node: Node, channel: str | None
) -> PartitionNumbers:
    """One partition's numbers from its leader, once the channel has caught up with the
    topic's end (so that its position can be told)."""
    url = f"http://{http_address(node)}/stats"
    params = stats_params(topic, partition, channel)
    tries = 0
    while True:
        tries += 1
        body = await _request(client, "GET", url, params)
        numbers = leader_numbers(body, http_address(node), topic, partition, channel)
        if numbers.settled or tries >= SETTLE_TRIES:
            return numbers
        await anyio.sleep(SETTLE_PAUSE)


def stats_params(topic: str, partition: int, channel: str | None) -> dict[str, str]:
    """The query of a partition leader's ``/stats`` for :func:`leader_numbers`."""
    params = {"format": "json", "topic": topic, "partition": str(partition)}
    if channel is not None:
        params["channel"] = channel
    params["needClients"] = "false"
    return params


def leader_numbers(
    body: bytes, http: str, topic: str, partition: int, channel: str | None
) -> PartitionNumbers:
    """A partition's numbers from its leader's ``/stats`` answer (``http``: the leader's
    address); NsqdHttpFailed when the answer is unusable or the node no longer leads."""
    try:
        numbers = parse_partition_stats(loads(body), topic, partition, channel)
    except (ValueError, RecursionError, ProtocolError) as exc:
        raise NsqdHttpFailed(f"nsqd {http} sent unusable stats: {exc!s:.200}") from exc
    if numbers is None:
        raise NsqdHttpFailed(
            f"nsqd {http} does not hold {topic!r} partition {partition} "
            "(lookupd's answer is out of date); try again"
        )
    if not numbers.leader:
        raise NsqdHttpFailed(
            f"nsqd {http} is not the leader of {topic!r} partition "
            f"{partition} (a leader change is under way); try again"
        )
    return numbers


async def read_partition(
    client: HttpClient, topic: str, partition: int, node: Node, channel: str | None
) -> PartitionOffsets:
    n = await stats(client, topic, partition, node, channel)
    return PartitionOffsets(
        topic=topic,
        partition=partition,
        nsqd=node.tcp_address,
        http=http_address(node),
        earliest=n.earliest,
        end=n.end,
        earliest_count=0 if n.earliest == 0 else None,
        end_count=n.end_count,
        channel=n.channel_offset,
        depth=n.depth if n.channel_found else None,
        channel_count=n.channel_count,
    )


class StartPlan:
    """A consumer's ``start``, ``partitions`` and ``advanced``; the start is applied once per
    partition (used by the Consumer).

    ``check`` runs when the consumer starts, if any of them was given: the topic must be
    partitioned, the partitions asked for must exist, explicit offsets must lie within what
    each partition retains.
    ``apply`` runs after a partition's first subscription, before any RDY: it moves the
    channel with ``/channel/setoffset`` on the partition's leader, unless another client is
    subscribed to that channel there. Later subscriptions (reconnects) resume where the
    channel is.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        start: StartAt | None,
        partitions: frozenset[int] | None,
        lookupds: list[str],
        advanced: bool = False,
    ) -> None:
        self.topic = topic
        self.channel = channel
        self.start = start
        self.partitions = partitions
        self.lookupds = lookupds
        # A start needs offsets to tell stale deliveries from fresh ones (see Skip).
        self.advanced = advanced or start is not None
        self._done: set[int] = set()

    @classmethod
    def from_options(
        cls,
        topic: str,
        channel: str,
        start: Start,
        partitions: Iterable[int] | None,
        advanced: bool,
        direct: Sequence[str],
        lookupds: list[str],
    ) -> StartPlan:
        """The Consumer's options, checked (nothing is asked yet)."""
        check_bool("advanced", advanced)
        wanted = check_partitions(partitions)
        start_at = check_start(start, wanted)
        if (start_at is not None or wanted is not None) and (direct or not lookupds):
            raise InvalidArgument(
                "start and partitions need lookupd_http_addresses and no nsqd_tcp_addresses: "
                "a topic's partitions and their leaders come from lookupd"
            )
        return cls(topic, channel, start_at, wanted, lookupds, advanced)

    def pending(self, partition: int | None) -> bool:
        return (
            self.start is not None
            and partition is not None
            and partition not in self._done
            and self.start.covers(partition)
        )

    async def check(self, timeout: float = 10.0) -> None:
        if not self.lookupds or not (self.start or self.partitions or self.advanced):
            return  # nothing asked for, or SUB_ADVANCED on nsqd given directly
        offsets = await partition_offsets(
            self.topic, lookupd_http_addresses=self.lookupds, timeout=timeout
        )
        known = {o.partition for o in offsets}
        wanted: Iterable[int] = self.partitions or ()
        if self.start is not None and self.start.offsets is not None:
            wanted = set(wanted) | set(self.start.offsets)
        missing = sorted(set(wanted) - known)
        if missing:
            raise InvalidArgument(
                f"topic {self.topic!r} has no partition {', '.join(map(str, missing))} "
                f"(it has {', '.join(map(str, sorted(known)))})"
            )
        if self.start is not None and self.start.offsets is not None:
            for o in offsets:
                offset = self.start.offsets.get(o.partition)
                if offset is not None and not o.earliest <= offset <= o.end:
                    raise OffsetOutOfRange(
                        f"start offset {offset} of {self.topic!r} partition {o.partition} is "
                        f"outside what it holds: queue offsets {o.earliest} (earliest) to "
                        f"{o.end} (end)"
                    )

    async def apply(self, partition: int, node: Node, ordered: bool) -> Skip | None:
        """Move the channel of ``partition`` (``ordered``: an ordered subscription) to the
        start; what to skip of the deliveries that follow, or None when nothing moved."""
        assert self.start is not None
        client = HttpClient()
        n = await stats(client, self.topic, partition, node, self.channel)
        if n.clients > 1:
            self._done.add(partition)
            log.warning(
                "%s/%s partition %d: not moving the channel to the start position: "
                "%d other clients consume it (only the channel's first consumer sets it)",
                self.topic,
                self.channel,
                partition,
                n.clients - 1,
            )
            return None
        where = f"{self.topic}/{self.channel} partition {partition}"
        at = start_offset(self.start, partition, n.earliest, n.end)
        if at is not None and n.channel_offset == at:
            # Moving it anyway would have nsqd deliver the message it holds ready twice.
            self._done.add(partition)
            log.info("%s: the channel is at the start already (queue offset %d)", where, at)
            return None
        body = setoffset_body(self.start, partition, n.earliest, n.end)
        params = {"topic": self.topic, "partition": str(partition), "channel": self.channel}
        url = f"http://{http_address(node)}/channel/setoffset"
        r = await _answer(client, "POST", url, params, body)
        if nothing_to_move(r.status, r.body) and n.earliest == n.end:
            self._done.add(partition)
            log.info("%s: nothing published yet; it starts with the first message", where)
            return None
        _ok(url, r)
        self._done.add(partition)
        log.info("%s: channel moved to %s", where, body.decode())
        # With messages to deliver, nsqd held one ready (see Skip).
        held = n.channel_offset if n.depth else None
        return skip_for(self.start, partition, n.earliest, n.end, held, ordered)
