"""to-http's --mode, unit level with a clock of the test's own: go-hostpool's pool (a failing
URL left aside 30 s, the wait doubling while it fails, all tried again when all fail)."""

from __future__ import annotations

from smartnsq.cli.upstreams import Upstreams


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_round_robin_and_all():
    rr = Upstreams(["a", "b", "c"], "round-robin")
    assert [rr.pick() for _ in range(4)] == [["a"], ["b"], ["c"], ["a"]]
    rr.mark("a", False)  # round-robin keeps no score
    assert rr.pick() == ["b"]
    assert Upstreams(["a", "b"], "all").pick() == ["a", "b"]


def test_hostpool_leaves_a_failing_url_aside_then_retries_it_with_a_doubling_wait():
    clock = Clock()
    pool = Upstreams(["a", "b"], "hostpool", clock=clock)
    assert pool.pick() == ["a"]
    pool.mark("a", False)
    assert [pool.pick() for _ in range(3)] == [["b"]] * 3  # a is aside for 30 s
    clock.now += 30
    assert pool.pick() == ["a"]  # retried once
    assert pool.pick() == ["b"]  # not again before its answer and another 30 s
    pool.mark("a", False)  # still failing: 60 s now
    clock.now += 30
    assert {pool.pick()[0] for _ in range(4)} == {"b"}
    clock.now += 30
    assert pool.pick() == ["a"]
    pool.mark("a", True)  # back: in turn again
    assert sorted(pool.pick()[0] for _ in range(4)) == ["a", "a", "b", "b"]


def test_hostpool_with_every_url_failing_tries_them_all_again():
    clock = Clock()
    pool = Upstreams(["a", "b"], "hostpool", clock=clock)
    for url in ("a", "b"):
        assert pool.pick() == [url]
        pool.mark(url, False)
    assert sorted(pool.pick()[0] for _ in range(2)) == ["a", "b"]


def test_epsilon_greedy_is_hostpool():
    assert Upstreams(["a"], "epsilon-greedy").mode == "hostpool"
