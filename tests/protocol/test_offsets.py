"""Start positions and partition stats, without a server."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest

from smartnsq import Consumer, partition_offsets
from smartnsq.errors import InvalidArgument, InvalidTopic, InvalidType, ProtocolError
from smartnsq.protocol import commands
from smartnsq.protocol.offsets import (
    MAX_TIMESTAMP,
    Skip,
    StartAt,
    check_partitions,
    check_start,
    parse_partition_stats,
    setoffset_body,
    skip_for,
)
from smartnsq.sync import partition_offsets as blocking_partition_offsets


def test_start_values_are_normalised():
    assert check_start(None) is None
    assert check_start("earliest") == StartAt("earliest")
    assert check_start("latest") == StartAt("latest")
    assert check_start(1_700_000_000) == StartAt("time", 1_700_000_000)
    assert check_start(1_700_000_000.9) == StartAt("time", 1_700_000_000)  # whole seconds
    utc = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert check_start(utc) == StartAt("time", int(utc.timestamp()))
    plus2 = dt.datetime(2024, 1, 2, 5, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert check_start(plus2) == check_start(utc)
    start = check_start({0: 10, 3: 0})
    assert start is not None and start.offsets == {0: 10, 3: 0}
    assert start.covers(3) and not start.covers(1)


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ("first", InvalidArgument, "'earliest', 'latest'"),
        (-1, InvalidArgument, ">= 0"),
        (float("nan"), InvalidArgument, ">= 0"),
        (MAX_TIMESTAMP + 1, InvalidArgument, "<="),
        (True, InvalidType, "bool"),
        (dt.datetime(2024, 1, 1), InvalidArgument, "aware"),
        ({}, InvalidArgument, "empty"),
        ({0: -1}, InvalidArgument, ">= 0"),
        ({0: 1.5}, InvalidType, "int queue offset"),
        ({0: True}, InvalidType, "int queue offset"),
        ({-1: 0}, InvalidArgument, "partition number"),
        ({"0": 0}, InvalidType, "partition number"),
        ([1, 2], InvalidType, "not list"),
    ],
)
def test_bad_start_values_say_what_to_fix(value, error, match):
    with pytest.raises(error, match=match):
        check_start(value)


def test_partitions():
    assert check_partitions(None) is None
    assert check_partitions([1, 0, 1]) == frozenset({0, 1})
    assert check_partitions(range(3)) == frozenset({0, 1, 2})
    with pytest.raises(InvalidArgument, match="empty"):
        check_partitions([])
    with pytest.raises(InvalidType):
        check_partitions("01")
    with pytest.raises(InvalidType):
        check_partitions(3)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        check_partitions([1024])
    with pytest.raises(InvalidArgument, match=r"partitions \[2\]"):
        check_start({0: 0, 2: 0}, frozenset({0, 1}))


def test_setoffset_body_and_what_to_skip():
    earliest, end = 64, 640
    cases = [
        ("earliest", b"virtual_queue:64", Skip(below_offset=64, at=64)),
        ("latest", b"virtual_queue:640", Skip(below_offset=640, at=640)),
        (1_700_000_000, b"timestamp:1700000000", Skip(before_ns=1_700_000_000 * 10**9)),
        ({1: 99}, b"virtual_queue:99", Skip(below_offset=99, at=99)),
    ]
    for value, body, skip in cases:
        start = check_start(value)
        assert start is not None
        assert setoffset_body(start, 1, earliest, end) == body
        assert skip_for(start, 1, earliest, end, None, True) == skip
        assert skip_for(start, 1, earliest, end, 300, True) == replace(skip, held=300)
        assert skip_for(start, 1, earliest, end, 300, False) == replace(skip, watch=True)
    assert Skip(below_offset=100).stale(99, 0)
    assert not Skip(below_offset=100).stale(100, 0)
    assert Skip(before_ns=5).stale(None, 4)
    assert not Skip(before_ns=5).stale(None, 5)


def test_the_message_held_ready_before_a_move_is_not_handed_on_twice():
    # Ordered: the held message comes first and again in its place; the first is answered.
    skip: Skip | None = Skip(below_offset=0, at=0, held=93)
    seen = []
    for offset in (93, 0, 31, 62, 93, 124):
        assert skip is not None
        stale, skip = skip.check(offset, 0, 1)
        seen.append(stale)
    assert seen == [True, False, False, False, False, False]
    # ... unless it is the start's own first message (then it is never taken for it).
    assert Skip(below_offset=93, at=93, held=93).check(93, 0, 1)[0] is False
    # Unordered: the first delivery off the start is handed on, its copy in its place not;
    # a retry of it after a failure (more attempts) is handed on.
    skip = Skip(below_offset=0, at=0, watch=True)
    seen = []
    for offset, attempts in ((124, 1), (0, 1), (124, 1), (124, 2), (155, 1)):
        assert skip is not None
        stale, skip = skip.check(offset, 0, attempts)
        seen.append(stale)
    assert seen == [False, False, True, False, False]
    # A first delivery at the start needs no watching.
    assert Skip(below_offset=0, at=0, watch=True).check(0, 0, 1) == (False, Skip(0, at=0))
    # By time: stale until the first fresh delivery, then nothing is skipped.
    skip = Skip(before_ns=5)
    assert skip.check(None, 4, 1) == (True, skip)
    assert skip.check(None, 5, 1) == (False, None)


def _stats(channels: list[dict], partition: str = "1") -> dict:
    return {
        "version": "0.3.7-HA.1.12.7",
        "topics": [
            {"topic_name": "other", "topic_partition": partition, "backend_start": 9},
            {
                "topic_name": "t",
                "topic_partition": partition,
                "is_leader": True,
                "backend_start": 32,
                "backend_depth": 320,
                "depth": 320,
                "message_count": 10,
                "channels": channels,
            },
        ],
    }


def test_partition_stats():
    ch = {"channel_name": "ch", "message_count": 10, "depth": 3, "depth_size": 96, "client_num": 2}
    other = {"channel_name": "x", "message_count": 10, "depth": 10, "depth_size": 288}
    n = parse_partition_stats(_stats([other, ch]), "t", 1, "ch")
    assert n is not None
    assert (n.earliest, n.end, n.end_count) == (32, 320, 10)
    assert (n.channel_offset, n.channel_count, n.depth, n.clients) == (224, 7, 3, 2)
    assert n.settled
    # The fork answers with every channel when the one asked for does not exist.
    n = parse_partition_stats(_stats([other]), "t", 1, "ch")
    assert n is not None and n.channel_offset is None and n.channel_count is None
    # A channel that has not seen the newest messages yet.
    lagging = dict(ch, message_count=9)
    n = parse_partition_stats({"status_code": 200, "data": _stats([lagging])}, "t", 1, "ch")
    assert n is not None and not n.settled
    assert parse_partition_stats(_stats([ch], partition="0"), "t", 1, "ch") is None
    with pytest.raises(ProtocolError):
        parse_partition_stats({"topics": None}, "t", 1, None)
    with pytest.raises(ProtocolError, match="backend_depth"):
        parse_partition_stats(
            {"topics": [{"topic_name": "t", "topic_partition": "1", "backend_start": 0}]},
            "t",
            1,
            None,
        )


def test_sub_advanced_command():
    assert commands.sub_advanced("t", "c", 2) == b"SUB_ADVANCED t c 2\n"
    assert commands.sub_advanced("t", "c") == b"SUB_ADVANCED t c\n"
    assert commands.sub_advanced("t", "c", 2, "special:-1") == b"SUB_ADVANCED t c 2 special:-1\n"
    with pytest.raises(InvalidArgument):
        commands.sub_advanced("t", "c", None, "msgcount:1")
    for bad in ("offset:1", "timestamp:", "msgcount:x", "timestamp:\u0661"):
        with pytest.raises(InvalidArgument):
            commands.sub_advanced("t", "c", 1, bad)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        (
            {"start": "earliest", "nsqd_tcp_addresses": ["127.0.0.1:4150"]},
            InvalidArgument,
            "lookupd",
        ),
        ({"partitions": [0], "nsqd_tcp_addresses": ["127.0.0.1:4150"]}, InvalidArgument, "lookupd"),
        ({"start": "soon"}, InvalidArgument, "earliest"),
        ({"start": {0: -5}}, InvalidArgument, ">= 0"),
        ({"partitions": []}, InvalidArgument, "empty"),
        ({"partitions": [0], "start": {1: 0}}, InvalidArgument, "leaves out"),
        ({"advanced": "yes"}, InvalidType, "advanced"),
    ],
)
def test_consumer_refuses_bad_start_options(options, error, match):
    options.setdefault(
        "lookupd_http_addresses", [] if "nsqd_tcp_addresses" in options else ["127.0.0.1:4161"]
    )
    with pytest.raises(error, match=match):
        Consumer("t", "c", lambda m: None, **options)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_partition_offsets_checks_its_arguments_before_asking(anyio_backend):
    good = ["127.0.0.1:1"]  # nothing listens there: a check that asked would fail otherwise
    with pytest.raises(InvalidTopic):
        await partition_offsets("no spaces", lookupd_http_addresses=good)
    with pytest.raises(InvalidArgument, match="channel"):
        await partition_offsets("t", lookupd_http_addresses=good, channel="a b")
    with pytest.raises(InvalidArgument, match="empty"):
        await partition_offsets("t", lookupd_http_addresses=[])
    with pytest.raises(InvalidType):
        await partition_offsets("t", lookupd_http_addresses=good, timeout="5")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="timeout"):
        blocking_partition_offsets("t", lookupd_http_addresses=good, timeout=0)
