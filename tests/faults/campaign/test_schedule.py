"""The campaign's schedule generator: pure, deterministic, and it draws everything."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.faults.campaign.schedule import (
    FAULT_KINDS,
    FORK_FAULT_KINDS,
    FORK_SINKS,
    FORK_SOURCES,
    HEALED_BY,
    SINKS,
    SOURCES,
    Schedule,
    _node,
    generate,
)

SEEDS = range(300)
ROOT = Path(__file__).resolve().parents[3]


def test_the_same_seed_gives_the_same_schedule():
    for seed in range(50):
        a, b = generate(seed, "classic", 0.5), generate(seed, "classic", 0.5)
        assert a == b
        assert a.digest() == b.digest()
        assert len(a.digest()) == 16 and int(a.digest(), 16) >= 0  # hex


def test_the_schedule_does_not_depend_on_global_random_state():
    a = generate(7)
    random.seed(12345)
    random.random()
    assert generate(7) == a


def test_another_process_draws_the_same_schedule():
    """A replay runs in a new process (another hash seed): same schedule, same digest."""
    code = "from tests.faults.campaign.schedule import generate; print(generate(11).digest())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "4242", "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    assert out.stdout.strip() == generate(11).digest()


def test_seeds_kinds_and_durations_give_different_schedules():
    digests = {generate(seed).digest() for seed in SEEDS}
    assert len(digests) == len(SEEDS)
    assert generate(1, "classic").digest() != generate(1, "youzan").digest()
    assert generate(1, minutes=0.5).digest() != generate(1, minutes=1.0).digest()


@pytest.mark.parametrize(
    ("kind", "kinds", "doors"),
    [
        ("classic", FAULT_KINDS, {*SOURCES, *SINKS}),
        ("youzan", FORK_FAULT_KINDS, {*SOURCES, *SINKS, *FORK_SINKS}),
    ],
)
def test_every_fault_kind_and_front_door_is_drawn(kind, kinds, doors):
    faults: Counter[str] = Counter()
    drawn: Counter[str] = Counter()
    for seed in SEEDS:
        s = generate(seed, kind, 1.0)
        faults.update(s.fault_kinds())
        drawn.update(s.doors())
    assert set(faults) == set(kinds), faults
    assert set(drawn) == doors, drawn
    assert min(faults.values()) >= 10, faults  # each kind in a fair share of the seeds


def test_the_fork_draws_ordered_flows_and_unordered_ones_with_every_door():
    ordered: Counter[str] = Counter()
    unordered: Counter[str] = Counter()
    for seed in SEEDS:
        for f in generate(seed, "youzan", 1.0).flows:
            if f.ordered:  # keyed publishers and an ordered consumer, which neither fail nor dawdle
                assert f.source in FORK_SOURCES and not f.failing and not f.slow_ms, f
                ordered.update((f.source, f.sink))
            else:
                assert f.source in SOURCES and f.sink in SINKS, f
                unordered.update((f.source, f.sink))
    assert set(ordered) == {*FORK_SOURCES, *FORK_SINKS}, ordered
    assert set(unordered) == {*SOURCES, *SINKS}, unordered
    assert min(unordered.values()) >= 20, unordered  # each door in a fair share of the seeds
    assert not any(f.ordered for s in SEEDS for f in generate(s, "classic", 1.0).flows)


@pytest.mark.parametrize("kind", ["classic", "youzan"])
@pytest.mark.parametrize("minutes", [0.25, 0.5, 1.0, 5.0])
def test_faults_heal_before_publishing_stops_and_do_not_overlap_on_a_node(kind, minutes):
    for seed in SEEDS:
        s = generate(seed, kind, minutes)
        _check_faults(s)


def _check_faults(s: Schedule) -> None:
    busy: dict[str, float] = {}
    for f in s.faults:  # sorted by offset
        assert f.at > 0 and f.hold > 0
        assert f.at + f.hold <= HEALED_BY * s.seconds, f
        assert f.at >= busy.get(_node(f), 0.0), (f, busy)
        busy[_node(f)] = f.at + f.hold
    assert (2 <= len(s.flows) <= 4) if s.kind == "classic" else (1 <= len(s.flows) <= 2)
    for f in s.faults:
        if f.kind == "client-signal":
            flow, side = f.target.split(".")
            door = getattr(s.flows[int(flow.removeprefix("flow"))], side)
            assert door in ("pub", "to-file", "to-nsq", "tail", "runner"), f
            assert f.how in ("SIGINT", "SIGTERM")
        if f.kind == "oversize":  # a flow's source mixes in big bodies
            assert f.target in {flow.topic for flow in s.flows}, f


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="kind"):
        generate(1, "nsq")
    with pytest.raises(ValueError, match="minutes"):
        generate(1, minutes=0)
