"""Start positions and partition offsets of the Youzan fork, without I/O.

A *queue offset* is the byte position of a message in its partition's disk queue: what the
fork sends in the 12-byte block of a ``SUB_ORDERED``/``SUB_ADVANCED`` delivery
(:attr:`RawMessage.offset`) and what ``virtual_queue:<offset>`` accepts. The next message of
a partition is at ``offset + raw_size``.

This module checks a consumer's ``start``/``partitions`` options, turns a start into the
argument nsqd's ``/channel/setoffset`` takes, and reads a partition's numbers out of an nsqd
``/stats?format=json`` answer.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeAlias

from smartnsq.errors import InvalidArgument, InvalidType, ProtocolError

#: What ``Consumer(start=...)`` accepts (see :func:`check_start`).
Start: TypeAlias = (
    Literal["earliest", "latest"] | int | float | _dt.datetime | Mapping[int, int] | None
)

# The fork multiplies the seconds into int64 nanoseconds: beyond this it overflows and
# answers "Invalid timestamp".
MAX_TIMESTAMP = (2**63 - 1) // 1_000_000_000
# nsqd parses offsets with strconv.ParseInt(..., 10, 0): int64.
MAX_OFFSET = 2**63 - 1
# Partition numbers are 10 bits of the fork's message ids.
MAX_PARTITION = 1023


@dataclass(frozen=True, slots=True)
class StartAt:
    """A checked start position.

    ``kind`` is ``"earliest"``, ``"latest"``, ``"time"`` (``value``: whole Unix seconds) or
    ``"offsets"`` (``offsets``: partition -> queue offset).
    """

    kind: str
    value: int = 0
    offsets: Mapping[int, int] | None = None

    def covers(self, partition: int) -> bool:
        """Whether this start moves ``partition`` (explicit offsets may name only some)."""
        return self.offsets is None or partition in self.offsets


def check_partition(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidType(f"{name} must be an int partition number, not {type(value).__name__}")
    if not 0 <= value <= MAX_PARTITION:
        raise InvalidArgument(
            f"{name} must be a partition number in 0..{MAX_PARTITION}, not {value}"
        )
    return value


def check_partitions(value: Iterable[int] | None) -> frozenset[int] | None:
    """``Consumer(partitions=...)``: None (every partition) or a non-empty set of numbers."""
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise InvalidType(
            f"partitions must be an iterable of partition numbers, not {type(value).__name__}"
        )
    numbers = frozenset(check_partition("each of partitions", p) for p in value)
    if not numbers:
        raise InvalidArgument("partitions is empty: give at least one, or None for every one")
    return numbers


def check_start(value: Any, partitions: frozenset[int] | None = None) -> StartAt | None:
    """``Consumer(start=...)``, checked and normalised.

    * ``None``: the channel's own position (nothing is moved).
    * ``"earliest"`` / ``"latest"``: the earliest retained message / only messages published
      from now on.
    * a Unix time: an int or float of seconds, or an aware :class:`datetime.datetime`. The
      fork resolves whole seconds: the start is the first message published at or after the
      start of that second (a fraction is dropped).
    * a mapping partition -> queue offset: each listed partition starts at the first message
      at or after that offset; unlisted partitions keep the channel's position.
    """
    if value is None:
        return None
    if isinstance(value, str):
        if value in ("earliest", "latest"):
            return StartAt(value)
        raise InvalidArgument(
            f"start must be 'earliest', 'latest', a Unix time, a datetime or a mapping of "
            f"partition to queue offset, not {value!r}"
        )
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidArgument(
                "start must be an aware datetime (with tzinfo, e.g. datetime.UTC): a naive "
                "one is ambiguous"
            )
        value = value.timestamp()
    if isinstance(value, bool):
        raise InvalidType("start must not be a bool")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise InvalidArgument(f"start as a Unix time must be >= 0 seconds, not {value!r}")
        seconds = math.floor(value)
        if seconds > MAX_TIMESTAMP:
            raise InvalidArgument(f"start as a Unix time must be <= {MAX_TIMESTAMP}, not {value!r}")
        return StartAt("time", seconds)
    if isinstance(value, Mapping):
        if not value:
            raise InvalidArgument("start is an empty mapping: give partition -> queue offset")
        offsets: dict[int, int] = {}
        for partition, offset in value.items():
            check_partition("a start partition", partition)
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise InvalidType(
                    f"start offset of partition {partition} must be an int queue offset, "
                    f"not {type(offset).__name__}"
                )
            if not 0 <= offset <= MAX_OFFSET:
                raise InvalidArgument(
                    f"start offset of partition {partition} must be a queue offset >= 0, "
                    f"not {offset}"
                )
            offsets[partition] = offset
        if partitions is not None and not offsets.keys() <= partitions:
            extra = sorted(offsets.keys() - partitions)
            raise InvalidArgument(
                f"start names partitions {extra} that partitions={sorted(partitions)} leaves out"
            )
        return StartAt("offsets", offsets=offsets)
    raise InvalidType(
        f"start must be 'earliest', 'latest', a Unix time, a datetime or a mapping of "
        f"partition to queue offset, not {type(value).__name__}"
    )


def start_offset(start: StartAt, partition: int, earliest: int, end: int) -> int | None:
    """The queue offset ``start`` moves ``partition`` to; None for a time (the fork finds
    the offset itself)."""
    if start.kind == "earliest":
        return earliest
    if start.kind == "latest":
        return end
    if start.kind == "time":
        return None
    assert start.offsets is not None
    return start.offsets[partition]


def setoffset_body(start: StartAt, partition: int, earliest: int, end: int) -> bytes:
    """The body of ``POST /channel/setoffset`` that moves ``partition`` to ``start``.

    ``earliest``/``end`` are the partition's current queue offsets: "earliest" and "latest"
    are sent as those exact offsets, so the position set is known (and a retention clean-up
    of the first messages does not make "the first message ever" fail).
    """
    offset = start_offset(start, partition, earliest, end)
    if offset is None:
        return b"timestamp:%d" % start.value
    return b"virtual_queue:%d" % offset


def nothing_to_move(status: int, body: bytes) -> bool:
    """Whether ``/channel/setoffset`` answered that the partition holds nothing to move to:
    the fork's HTTP 500 "commit log end of file", which it gives for any position of a
    partition nothing was published to."""
    return status == 500 and b"commit log end of file" in body


@dataclass(frozen=True, slots=True)
class Skip:
    """Which deliveries right after a start are left over from before it.

    nsqd's channel reads one message ahead even with no client ready; a reset of the
    channel's position still delivers that message first (nsqd/channel.go, "retry
    delivering msg to client, regardless reset result"), and then again in its place. An
    offset below the start is stale whenever it comes (a message in flight before the reset
    and requeued later, say); a timestamp only until the first fresh delivery, as message
    times within a partition need not rise. The message held ready is the channel's position
    on an ordered channel (``held``: answered, not handed on, when it comes first); an
    unordered channel reads further ahead, so there the first delivery off the start is
    handed on and its copy in its place answered (``watch``, then ``again``).
    """

    below_offset: int | None = None  # queue offsets under this one are stale
    before_ns: int | None = None  # message timestamps (ns) under this one are stale
    at: int | None = None  # the start's queue offset; None for a time
    held: int | None = None  # ordered: the offset of the message held ready (first only)
    watch: bool = False  # unordered: the first delivery, if off the start, comes again
    again: tuple[int, int] | None = None  # (offset, attempts) of that first delivery

    def stale(self, offset: int | None, timestamp: int) -> bool:
        if self.below_offset is not None and offset is not None and offset < self.below_offset:
            return True
        return self.before_ns is not None and timestamp < self.before_ns

    def check(self, offset: int | None, timestamp: int, attempts: int) -> tuple[bool, Skip | None]:
        """Whether a delivery is stale (to be answered, not handed on), and what to skip
        from then on."""
        first = self.held is not None or self.watch
        if not first and self.again is None and self.before_ns is None:
            return self.stale(offset, timestamp), self  # the usual case: nothing changes
        after = replace(self, held=None, watch=False) if first else self
        if first and offset == self.held and offset != self.at:
            return True, after
        again = self.again
        if again is not None and offset == again[0] and attempts <= again[1]:
            return True, replace(after, again=None)
        if self.stale(offset, timestamp):
            return True, after
        if first and self.watch and offset is not None and offset != self.at:
            again = (offset, attempts)
        # Fresh: times need not rise, so nothing more by time.
        if after.below_offset is None and again is None:
            return False, None
        return False, replace(after, before_ns=None, again=again)


def skip_for(
    start: StartAt, partition: int, earliest: int, end: int, held: int | None, ordered: bool
) -> Skip:
    """What to skip after moving ``partition`` to ``start``; ``held``: the channel's
    position before the move when it had messages to deliver, else None."""
    at = start_offset(start, partition, earliest, end)
    return Skip(
        below_offset=at,
        before_ns=start.value * 1_000_000_000 if at is None else None,
        at=at,
        held=held if ordered else None,
        watch=held is not None and not ordered,
    )


@dataclass(frozen=True, slots=True)
class PartitionNumbers:
    """One partition's numbers as an nsqd ``/stats`` answer gives them."""

    leader: bool
    earliest: int
    end: int
    end_count: int
    channel_found: bool = False
    channel_end_count: int = 0
    depth: int = 0
    depth_size: int = 0
    clients: int = 0

    @property
    def settled(self) -> bool:
        """The channel has seen every message the topic has (its end is the topic's end).

        The channel learns of new messages a moment after the topic: until then its
        position cannot be told from these numbers.
        """
        return not self.channel_found or self.channel_end_count == self.end_count

    @property
    def channel_offset(self) -> int | None:
        """The channel's confirmed queue offset: everything before it is finished."""
        return self.end - self.depth_size if self.channel_found else None

    @property
    def channel_count(self) -> int | None:
        return self.channel_end_count - self.depth if self.channel_found else None


def _num(data: Mapping[str, Any], key: str, where: str) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProtocolError(f"nsqd stats for {where}: {key!r} is not a count ({value!r:.50})")
    return value


def parse_partition_stats(
    body: Any, topic: str, partition: int, channel: str | None
) -> PartitionNumbers | None:
    """The numbers of ``topic`` partition ``partition`` (and ``channel``) from a decoded
    ``/stats?format=json`` answer of the fork's nsqd; None when it does not hold it.

    Mind that the fork answers with *every* channel when the one asked for does not exist.
    """
    if isinstance(body, dict) and "data" in body and "status_code" in body:
        body = body["data"]  # the legacy envelope
    topics = body.get("topics") if isinstance(body, dict) else None
    if not isinstance(topics, list):
        raise ProtocolError("nsqd stats answer has no 'topics' list")
    where = f"{topic} partition {partition}"
    for t in topics:
        if not isinstance(t, dict) or t.get("topic_name") != topic:
            continue
        if str(t.get("topic_partition")) != str(partition):
            continue
        found = None
        if channel is not None:
            for c in t.get("channels") or ():
                if isinstance(c, dict) and c.get("channel_name") == channel:
                    found = c
                    break
        numbers = PartitionNumbers(
            leader=bool(t.get("is_leader", True)),
            earliest=_num(t, "backend_start", where),
            end=_num(t, "backend_depth", where),
            end_count=_num(t, "message_count", where),
        )
        if found is None:
            return numbers
        cwhere = f"{where} channel {channel}"
        clients = found.get("client_num")
        return PartitionNumbers(
            leader=numbers.leader,
            earliest=numbers.earliest,
            end=numbers.end,
            end_count=numbers.end_count,
            channel_found=True,
            channel_end_count=_num(found, "message_count", cwhere),
            depth=_num(found, "depth", cwhere),
            depth_size=_num(found, "depth_size", cwhere),
            clients=clients if isinstance(clients, int) and clients >= 0 else 0,
        )
    return None
