"""What both producers share about their nsqd, without a server: which nsqd and which
connection the next request takes (a stalled nsqd passed over), what a lost or timed-out
connection does to its node, and the bookkeeping of a publish_many's batches."""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import pytest

from smartnsq import Producer
from smartnsq import sync as blocking
from smartnsq.errors import ConnectionClosed, PartialPublish
from smartnsq.producer.nodes import Node, rank
from smartnsq.producer.plan import Batches, BatchRun, Request
from tests.producer.parts import nodes, plan


@dataclass
class FakeConn:
    pending: int = 0
    usable: bool = True
    retiring: bool = False
    close_reason: BaseException | None = None
    waiting_since: float = math.inf  # when the oldest pending request was sent


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


def test_a_lost_connection_marks_its_node_down_but_one_we_closed_does_not() -> None:
    routes = nodes()
    node = routes.direct[0]
    ours = FakeConn(retiring=True)
    lost = FakeConn(close_reason=ConnectionClosed("reset"))
    node.add(ours)
    node.add(lost)
    routes.forget(node, ours, closing=False)
    assert not node.failures and node.connections == [lost]
    routes.forget(node, lost, closing=False)
    assert node.failures == 1 and node.connections == []
    routes.forget(node, lost, closing=False)  # told twice (a timeout, then the close): once
    assert node.failures == 1


def test_a_connection_that_ends_while_the_producer_closes_does_not_mark_its_node_down() -> None:
    routes = nodes()
    node = routes.direct[0]
    lost = FakeConn(close_reason=ConnectionClosed("reset"))
    node.add(lost)
    routes.forget(node, lost, closing=True)
    assert not node.failures and node.connections == []


def test_a_timed_out_request_counts_an_error_and_avoids_the_node() -> None:
    routes = nodes()
    node = routes.direct[0]
    routes.timed_out(node)
    assert node.errors == 1 and node.failures == 1
    assert not node.claim(routes.now())  # avoided for a while


def test_a_failed_batch_after_acknowledged_ones_is_a_partial_publish() -> None:
    requests = [Request(lambda p: b"", count=2), Request(lambda p: b"", count=3)]
    run = BatchRun(plan(), "t", Batches(requests, 5, routed=False, traced=False))
    first = ConnectionClosed("first batch")
    assert run.failed(first) is first  # nothing acknowledged yet: the error itself
    assert run.unacknowledged == 5
    run.answered(requests[0], b"OK", "127.0.0.1:4150", None)
    err = run.failed(ConnectionClosed("second batch"))
    assert isinstance(err, PartialPublish) and err.published == 2
    assert run.unacknowledged == 3  # what the producer counts as failed
    assert run.results() is None


@pytest.mark.parametrize(
    "method", ["__init__", "publish", "publish_many", "is_ext_topic", "close", "stats"]
)
def test_both_producers_have_the_same_methods_with_the_same_parameters(method: str) -> None:
    """The two front doors are one API: a parameter added to one is added to the other."""

    def params(cls: type) -> list[tuple[str, object, object]]:
        sig = inspect.signature(getattr(cls, method))
        return [(p.name, p.kind, p.default) for p in sig.parameters.values()]

    assert params(Producer) == params(blocking.Producer)


# -- which nsqd the next request goes to ------------------------------------------------------


def test_rank_orders_working_nodes_by_load_then_stalled_then_down() -> None:
    now, stall = 100.0, 0.2
    assert rank(None, now, stall) == (0, 0)  # not connected yet: idle
    assert rank(node_with(FakeConn()), now, stall) == (0, 0)
    busy = node_with(FakeConn(pending=3, waiting_since=now - 0.01), FakeConn(pending=2))
    assert rank(busy, now, stall) == (0, 5)
    stalled = node_with(FakeConn(pending=1, waiting_since=now - 0.21))
    assert rank(stalled, now, stall) == (1, 1)
    down = node_with()
    down.mark_down(now, "test")
    assert rank(down, now, stall)[0] == 2
    assert sorted([down, stalled, busy], key=lambda n: rank(n, now, stall)) == [
        busy,
        stalled,
        down,
    ]


def test_a_stalled_nsqd_is_passed_over_while_another_works_and_used_again_once_it_answers() -> None:
    routes = nodes("127.0.0.1:4150", "127.0.0.1:4250", timeout=2.0)
    silent, good = routes.direct
    stuck = FakeConn(pending=1, waiting_since=routes.now() - 0.25)  # > timeout / 10
    silent.add(stuck)
    good.add(FakeConn(pending=4, waiting_since=routes.now()))  # busier, but answering
    firsts = [next(routes.direct_candidates()) for _ in range(6)]
    assert firsts == [good] * 6
    assert not silent.failures  # passed over, not marked down
    # it is still a candidate, after the one that works (should that fail to connect)
    assert list(routes.direct_candidates()) == [good, silent]
    stuck.pending, stuck.waiting_since = 0, math.inf  # it answered
    good.connections[0].pending = 0
    firsts = {next(routes.direct_candidates()) for _ in range(4)}
    assert firsts == {silent, good}  # turns again


def test_a_request_waiting_less_than_a_tenth_of_the_timeout_is_not_a_stall() -> None:
    routes = nodes("127.0.0.1:4150", "127.0.0.1:4250", timeout=2.0)
    slow, idle = routes.direct
    waiting = FakeConn(pending=1, waiting_since=routes.now() - 0.15)
    slow.add(waiting)
    idle.add(FakeConn())
    # not stalled, only busier: the least busy goes first, the other stays a candidate
    assert list(routes.direct_candidates()) == [idle, slow]
    assert rank(slow, routes.now(), 0.2)[0] == 0
    idle.connections[0].pending = 2
    idle.connections[0].waiting_since = routes.now()
    assert next(routes.direct_candidates()) is slow  # now the least busy


def test_new_requests_do_not_pile_onto_an_nsqd_that_has_not_answered_yet() -> None:
    """Concurrent publishers: the moment one request waits on a silent nsqd, the next go to
    the other, before any threshold: otherwise every publisher would wait there."""
    routes = nodes("127.0.0.1:4150", "127.0.0.1:4250")
    silent, good = routes.direct
    silent.add(FakeConn(pending=1, waiting_since=routes.now()))
    good.add(FakeConn())
    assert [next(routes.direct_candidates()) for _ in range(4)] == [good] * 4


def test_a_stalled_nsqd_is_still_preferred_to_one_that_is_down() -> None:
    routes = nodes("127.0.0.1:4150", "127.0.0.1:4250", timeout=2.0)
    stalled, down = routes.direct
    stalled.add(FakeConn(pending=1, waiting_since=routes.now() - 1.0))
    down.mark_down(routes.now(), "test")
    assert list(routes.direct_candidates()) == [stalled, down]


def test_lookupd_routed_turns_pass_over_a_stalled_nsqd_too() -> None:
    routes = nodes(nsqd_tcp_addresses=[], lookupd_http_addresses=["127.0.0.1:4161"], timeout=2.0)
    addresses = ["127.0.0.1:4150", "127.0.0.1:4250"]
    silent, good = (routes.node(a) for a in addresses)
    good.add(FakeConn())
    assert [routes.take_turns("t", addresses) for _ in range(4)] == [0, 1, 0, 1]
    stuck = FakeConn(pending=1, waiting_since=routes.now() - 0.25)
    silent.add(stuck)
    assert [routes.take_turns("t", addresses) for _ in range(4)] == [1, 1, 1, 1]
    assert not silent.failures
    stuck.pending, stuck.waiting_since = 0, math.inf  # it answered
    assert [routes.take_turns("t", addresses) for _ in range(4)] == [0, 1, 0, 1]
