"""What both producers share about their nsqd, without a server: which connection the next
request takes, what a lost or timed-out connection does to its node, and the bookkeeping of
a publish_many's batches."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import anyio
import pytest

from smartnsq import Producer
from smartnsq import sync as blocking
from smartnsq.errors import ConnectionClosed, PartialPublish
from smartnsq.publish_nodes import Node
from smartnsq.publishing import Batches, BatchRun, Request


@dataclass
class FakeConn:
    pending: int = 0
    usable: bool = True
    retiring: bool = False
    close_reason: BaseException | None = None


def node_with(*conns: FakeConn) -> Node[FakeConn, None]:
    node: Node[FakeConn, None] = Node("127.0.0.1:4150", None)
    for conn in conns:
        node.add(conn)
    return node


def test_an_idle_connection_is_reused_rather_than_opening_another() -> None:
    idle = FakeConn()
    assert node_with(idle).reusable(most=2) is idle
    busy = FakeConn(pending=3)
    assert node_with(busy, idle).reusable(most=3) is idle


def test_a_busy_connection_is_shared_only_once_there_are_enough() -> None:
    busy = FakeConn(pending=1)
    assert node_with(busy).reusable(most=2) is None  # open a second one
    assert node_with(busy).reusable(most=1) is busy
    busier = FakeConn(pending=5)
    assert node_with(busier, busy).reusable(most=2) is busy  # the least loaded


def test_connections_that_are_not_usable_are_never_chosen_and_closed_ones_dropped() -> None:
    closing = FakeConn(usable=False, retiring=True)
    closed = FakeConn(usable=False, close_reason=ConnectionClosed("reset"))
    node = node_with(closing, closed)
    assert node.reusable(most=1) is None
    fresh = FakeConn()
    node.add(fresh)
    assert node.connections == [closing, fresh]  # close() still waits for the closing one
    assert node.load() == (2, 0)


@pytest.mark.parametrize("make", [Producer, blocking.Producer])
def test_a_lost_connection_marks_its_node_down_but_one_we_closed_does_not(make: type) -> None:
    async def check() -> None:  # the async Producer reads its event loop's clock
        producer = make(["127.0.0.1:4150"])
        node = producer._direct[0]
        ours = FakeConn(retiring=True)
        lost = FakeConn(close_reason=ConnectionClosed("reset"))
        node.add(ours)
        node.add(lost)
        producer._forget(node, ours)
        assert not node.failures and node.connections == [lost]
        producer._forget(node, lost)
        assert node.failures == 1 and node.connections == []
        producer._forget(node, lost)  # told twice (a timeout, then the close): counted once
        assert node.failures == 1

    anyio.run(check)


def test_a_timed_out_request_counts_an_error_and_avoids_the_node() -> None:
    producer = blocking.Producer(["127.0.0.1:4150"])
    node = producer._direct[0]
    producer._timed_out(node)
    assert node.errors == 1 and node.failures == 1
    assert not node.claim(producer._now())  # avoided for a while


def test_a_failed_batch_after_acknowledged_ones_is_a_partial_publish() -> None:
    producer = blocking.Producer(["127.0.0.1:4150"])
    requests = [Request(lambda p: b"", count=2), Request(lambda p: b"", count=3)]
    run = BatchRun(producer, "t", Batches(requests, 5, routed=False, traced=False))
    first = ConnectionClosed("first batch")
    assert run.failed(first) is first  # nothing acknowledged yet: the error itself
    run.answered(requests[0], b"OK", "127.0.0.1:4150", None)
    err = run.failed(ConnectionClosed("second batch"))
    assert isinstance(err, PartialPublish) and err.published == 2
    assert run.results() is None
    assert producer.stats().failed == 5 + 3


@pytest.mark.parametrize("method", ["publish", "publish_many", "close", "stats"])
def test_both_producers_have_the_same_methods_with_the_same_parameters(method: str) -> None:
    """The two front doors are one API: a parameter added to one is added to the other."""

    def params(cls: type) -> list[tuple[str, object, object]]:
        sig = inspect.signature(getattr(cls, method))
        return [(p.name, p.kind, p.default) for p in sig.parameters.values()]

    assert params(Producer) == params(blocking.Producer)
