"""Offset options and micro-batch planning of the Youzan source (no Spark, no servers)."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smartnsq.errors import DataLoss, InvalidArgument
from smartnsq.spark.offsets_plan import (
    At,
    check_retained,
    group,
    parse_spec,
    parse_time,
    resolve,
    spread,
)
from smartnsq.spark.range_read import Range
from smartnsq.spark.youzan import PartitionInfo


def part(p: int, earliest: int, end: int, size: int = 10) -> PartitionInfo:
    return PartitionInfo("t", p, "n:1", "n:2", earliest, end, end // size, False, False)


INFOS = [part(0, 0, 1000), part(1, 200, 500)]


def test_specs_parse_like_kafka() -> None:
    assert parse_spec("startingOffsets", " Earliest ", "t", ending=False) == "earliest"
    assert parse_spec("startingOffsets", '{"t": {"0": 5, "1": -2}}', "t", ending=False) == {
        0: 5,
        1: -2,
    }
    assert parse_spec("endingOffsets", '{"t": {"0": -1}}', "t", ending=True) == {0: -1}


@pytest.mark.parametrize(
    ("option", "value", "text"),
    [
        ("startingOffsets", "soon", "must be earliest, latest or JSON"),
        ("startingOffsets", '{"u": {"0": 1}}', "with the one key 't'"),
        ("startingOffsets", '{"t": []}', "must map partition numbers to offsets"),
        ("startingOffsets", '{"t": {"x": 1}}', "partition 'x' is not a number"),
        ("startingOffsets", '{"t": {"0": -3}}', "must be a queue offset >= 0"),
        ("startingOffsets", '{"t": {"0": "5"}}', "must be a queue offset >= 0"),
        ("endingOffsets", '{"t": {"0": -2}}', "or -1 \\(latest\\)"),
        ("endingOffsets", "earliest", "cannot be 'earliest'"),
    ],
)
def test_bad_specs_name_the_option(option: str, value: str, text: str) -> None:
    with pytest.raises(InvalidArgument, match=f"option '{option}'.*{text}"):
        parse_spec(option, value, "t", ending=option == "endingOffsets")


def test_times_are_milliseconds_like_kafka() -> None:
    assert parse_time("startingTimestamp", " 1700000000123 ") == At(1700000000123)
    for bad in ("soon", "-1", "1.5", "99999999999999999999"):
        with pytest.raises(InvalidArgument, match="option 'endingTimestamp' must be a Unix time"):
            parse_time("endingTimestamp", bad)


def test_resolve_against_the_partitions() -> None:
    assert resolve("o", "earliest", INFOS) == {0: 0, 1: 200}
    assert resolve("o", "latest", INFOS) == {0: 1000, 1: 500}
    assert resolve("o", {0: 30, 1: -1}, INFOS) == {0: 30, 1: 500}
    with pytest.raises(InvalidArgument, match="names partition\\(s\\) \\[2\\]"):
        resolve("o", {0: 1, 1: 1, 2: 1}, INFOS)
    with pytest.raises(InvalidArgument, match="no offset for partition\\(s\\) \\[1\\]"):
        resolve("o", {0: 1}, INFOS)
    with pytest.raises(InvalidArgument, match="offset 501 of partition 1 is past its end"):
        resolve("o", {0: 1, 1: 501}, INFOS)


def test_offsets_no_longer_retained(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(DataLoss, match="offsets 100 to 200 are no longer retained"):
        check_retained({0: 0, 1: 100}, INFOS, True)
    with caplog.at_level(logging.WARNING, logger="smartnsq.spark"):
        assert check_retained({0: 0, 1: 100}, INFOS, False) == {0: 0, 1: 200}
    assert "skipped (failOnDataLoss=false)" in caplog.text


def test_limit_is_spread_over_the_backlogs() -> None:
    # 100 messages behind in partition 0, 30 in partition 1 (10 offsets each).
    start, end = {0: 0, 1: 200}, {0: 1000, 1: 500}
    assert spread(1000, start, end, INFOS) == end
    cut = spread(13, start, end, INFOS)
    assert cut == {0: 100, 1: 230}  # 10 and 3 messages
    # Every partition with a backlog moves on, however small its share.
    assert spread(1, start, end, INFOS) == {0: 10, 1: 210}


def test_tasks_group_partitions_evenly() -> None:
    a, b, c, d = (Range(part(p, 0, 0), 0, size) for p, size in enumerate((900, 100, 500, 400)))
    assert group([a, b, c, d], 2) == [(a, b), (c, d)]  # 1000 and 900 offsets
    assert group([a, b, c, d], 1) == [(a,), (b,), (c,), (d,)]
    assert group([a, b, c, d], 3) == [(a, b), (c, d)]  # two tasks are needed: 1000 and 900
    assert group([a, b, c, d], 8) == [(a, b, c, d)]
    assert group([], 2) == []


@given(
    sizes=st.lists(st.integers(min_value=1, max_value=10**9), max_size=40),
    per_task=st.integers(min_value=1, max_value=10),
)
def test_every_range_is_read_by_exactly_one_task(sizes: list[int], per_task: int) -> None:
    ranges = [Range(part(p, 0, 0), 7, 7 + size) for p, size in enumerate(sizes)]
    tasks = group(ranges, per_task)
    assert len(tasks) == -(-len(ranges) // per_task)
    assert all(1 <= len(t) <= per_task for t in tasks)
    assert sorted(r.info.partition for t in tasks for r in t) == list(range(len(ranges)))
    # No task carries more than the most a task must carry plus the longest range.
    loads = [sum(r.end - r.start for r in t) for t in tasks]
    if loads:
        assert max(loads) <= sum(sizes) / len(tasks) + max(sizes)
