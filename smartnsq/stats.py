"""What :meth:`Producer.stats` and :meth:`Consumer.stats` return.

Both have the same shape: totals, then ``nodes``, one entry per nsqd address (per
partition on a Youzan partitioned topic, which gets one consumer connection each). The
counters only grow; a snapshot costs nothing until it is taken.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ProducerNodeStats:
    """One nsqd, as a producer sees it.

    Attributes:
        address: The nsqd's TCP address.
        published: Messages it acknowledged.
        requests: Requests (PUB, MPUB, DPUB...) it acknowledged.
        errors: Requests that failed there (including failures retried elsewhere, and
            connections that could not be opened).
        connections: Open connections to it.
        pending: Requests sent to it and not answered yet.
        down: Whether it is being avoided after a failure.
    """

    address: str
    published: int
    requests: int
    errors: int
    connections: int
    pending: int
    down: bool


@dataclass(frozen=True, slots=True)
class ProducerStats:
    """A producer's counters since it was created.

    Attributes:
        published: Messages acknowledged by nsqd (a ``publish_many`` of 200 counts 200).
        requests: Requests acknowledged by nsqd.
        failed: Messages of calls that raised after their input was accepted (not
            acknowledged, or unknown after a timeout); bad input is not counted.
        retried: Requests sent again after a failure (attempts beyond the first).
        connections: Open connections, all nsqd together.
        nodes: Per nsqd address.
    """

    published: int
    requests: int
    failed: int
    retried: int
    connections: int
    nodes: Mapping[str, ProducerNodeStats]


@dataclass(frozen=True, slots=True)
class ConsumerNodeStats:
    """One subscribed connection, as a consumer sees it.

    Attributes:
        address: The nsqd's TCP address.
        partition: The Youzan partition it reads, or ``None``.
        received: Messages received on this connection.
        rdy: The RDY count it was last given.
        in_flight: Messages received on it and not answered yet.
    """

    address: str
    partition: int | None
    received: int
    rdy: int
    in_flight: int


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """A consumer's counters since it started.

    Attributes:
        received: Messages received.
        finished: Messages finished (FIN written, and not refused by nsqd).
        requeued: Messages requeued (REQ written, and not refused by nsqd).
        discarded: Messages given up on after ``max_attempts``.
        connections: Subscribed connections now.
        in_flight: Messages received and not answered yet.
        backoff_level: The backoff level (0: not backing off).
        nodes: Per subscribed connection, keyed by nsqd address (``"address/partition"``
            for a Youzan partition); counts of a connection start again when it is
            replaced.
        refused: FINs and REQs nsqd refused (``E_FIN_FAILED``, ``E_REQ_FAILED``: the
            message was no longer in flight, say it had timed out and nsqd delivers it
            again); not counted in ``finished`` or ``requeued``.
    """

    received: int
    finished: int
    requeued: int
    discarded: int
    connections: int
    in_flight: int
    backoff_level: int
    nodes: Mapping[str, ConsumerNodeStats]
    refused: int = 0


def node_key(address: str, partition: int | None) -> str:
    """The ``nodes`` key of a connection: its address, with the partition when it has one."""
    return address if partition is None else f"{address}/{partition}"


class _Reader(Protocol):
    address: str
    partition: int | None
    received: int
    rdy: int
    in_flight: int


def consumer_stats(
    received: int,
    finished: int,
    requeued: int,
    discarded: int,
    backoff_level: int,
    readers: Sequence[_Reader],
    refused: int = 0,
) -> ConsumerStats:
    """A consumer's snapshot from its counters and its subscribed connections."""
    nodes = {
        node_key(r.address, r.partition): ConsumerNodeStats(
            r.address, r.partition, r.received, r.rdy, r.in_flight
        )
        for r in readers
    }
    return ConsumerStats(
        received=received,
        finished=finished,
        requeued=requeued,
        discarded=discarded,
        connections=len(nodes),
        in_flight=sum(n.in_flight for n in nodes.values()),
        backoff_level=backoff_level,
        nodes=nodes,
        refused=refused,
    )
