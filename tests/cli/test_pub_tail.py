"""pub and tail against a real classic nsqd."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.cli.clihelp import LineReader, lines_of, run_cli, spawn_cli, wait_exit
from tests.helpers import channel_stats, create_channel, topic_stats, unique, wait_for

pytestmark = pytest.mark.integration


def _channels(nsqd_http: str, topic: str) -> list[str]:
    return [c["channel_name"] for c in (topic_stats(nsqd_http, topic) or {}).get("channels") or []]


def _message_count(nsqd_http: str, topic: str) -> int:
    return int((topic_stats(nsqd_http, topic) or {}).get("message_count", 0))


def test_tail_prints_what_pub_publishes(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_tail")
    tail = spawn_cli("tail", "--nsqd", nsqd.tcp, "-n", "4", topic)
    reader = LineReader(tail.stdout)
    # tail reads from a fresh ephemeral channel: publish once it is subscribed.
    channels = wait_for(lambda: _channels(nsqd.http, topic), what="tail's channel")
    assert len(channels) == 1 and channels[0].endswith("#ephemeral")
    lines = ["first", "ünïcödé", '{"json": true}', "last"]
    pub = run_cli("pub", "--nsqd", nsqd.tcp, topic, input=lines_of(*lines))
    assert pub.returncode == 0, pub.stderr
    assert pub.stderr == b""  # quiet on success when stderr is not a terminal
    assert wait_exit(tail) == 0, tail.stderr.read()  # type: ignore[union-attr]
    assert [line.decode() for line in reader.wait_for(4)] == lines
    # nsqd deletes an ephemeral channel when its last reader goes.
    wait_for(lambda: not _channels(nsqd.http, topic), what="the ephemeral channel to go")


def test_pub_files_skips_empty_lines_and_tail_json_reads_a_real_channel(classic_cluster, tmp_path):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_files")
    a = tmp_path / "a.txt"
    a.write_bytes(b"x\n\ny\r\n")
    b = tmp_path / "b.txt"
    b.write_bytes(b"z")  # no newline at the end: still a line
    pub = run_cli("pub", "--nsqd", nsqd.tcp, "--json", topic, str(a), str(b))
    assert pub.returncode == 0, pub.stderr
    summary = json.loads(pub.stdout)
    assert summary["published"] == 3 and summary["skipped_empty"] == 1
    assert summary["failed"] == 0 and not summary["interrupted"]
    raw = run_cli("pub", "--nsqd", nsqd.tcp, "--raw", topic, str(a))
    assert raw.returncode == 0, raw.stderr
    assert _message_count(nsqd.http, topic) == 4
    # A real channel created now gets what the topic holds.
    tail = run_cli(
        "tail", "--nsqd", nsqd.tcp, "--channel", "keep", "-n", "4", "--json", "--show-meta", topic
    )
    assert tail.returncode == 0, tail.stderr
    records = [json.loads(line) for line in tail.stdout.splitlines()]
    assert [r["body"] for r in records] == ["x", "y", "z", "x\n\ny\r\n"]
    assert all(r["attempts"] == 1 and r["nsqd"] == nsqd.tcp for r in records)
    assert all("partition" not in r for r in records)  # classic nsqd: no Youzan fields
    assert "keep" in _channels(nsqd.http, topic)  # not ephemeral: still there


def test_ctrl_c_stops_reading_and_says_how_many_were_published(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_int")
    pub = spawn_cli("pub", "--nsqd", nsqd.tcp, topic, stdin=subprocess.PIPE)
    assert pub.stdin is not None
    pub.stdin.write(lines_of("one", "two", "three"))
    pub.stdin.flush()  # the pipe stays open: pub is waiting for more input
    wait_for(lambda: _message_count(nsqd.http, topic) == 3, what="3 published messages")
    pub.send_signal(signal.SIGINT)
    assert wait_exit(pub) == 130
    err = pub.stderr.read().decode()  # type: ignore[union-attr]
    assert err.splitlines() == [
        f"smartnsq pub: interrupted: published 3 messages to {topic}; "
        "acknowledged up to <stdin>:3: go on with --resume-from 3"
    ]
    pub.stdin.close()


def test_rate_caps_messages_per_second(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_rate")
    started = time.monotonic()
    pub = run_cli(
        "pub", "--nsqd", nsqd.tcp, "--rate", "20", topic, input=lines_of(*map(str, range(11)))
    )
    elapsed = time.monotonic() - started
    assert pub.returncode == 0, pub.stderr
    assert _message_count(nsqd.http, topic) == 11
    # 11 messages at 20/s: the last one may go 0.5 s after the first, not sooner.
    assert elapsed >= 0.5


def _left_in(nsqd_http: str, topic: str, channel: str) -> int | None:
    c = channel_stats(nsqd_http, topic, channel)
    if c is None or c["in_flight_count"]:
        return None
    return int(c["depth"] + c["deferred_count"])


def test_tail_to_a_full_disk_stops_with_one_line_and_gives_every_message_back(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_tail_full")
    create_channel(nsqd.http, topic, "keep")
    assert run_cli("pub", "--nsqd", nsqd.tcp, topic, input=lines_of(*"abcdefghij")).returncode == 0
    with open("/dev/full", "wb") as full:  # every write fails: No space left on device
        tail = spawn_cli("tail", "--nsqd", nsqd.tcp, "--channel", "keep", topic, stdout=full)
        status = wait_exit(tail, timeout=20)
    err = tail.stderr.read().decode()  # type: ignore[union-attr]
    assert status == 1, err
    assert err == "smartnsq tail: error: cannot write to stdout: No space left on device\n"
    # Not one message given up or finished unprinted: all ten are back in the channel.
    assert wait_for(lambda: _left_in(nsqd.http, topic, "keep") == 10, what="all back")


def test_tail_into_a_reader_that_goes_away_ends_with_0_and_keeps_the_rest(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_tail_head")
    create_channel(nsqd.http, topic, "keep")
    bodies = [f"m{i:03d}-" + "x" * 1000 for i in range(500)]  # more than a pipe holds
    assert run_cli("pub", "--nsqd", nsqd.tcp, topic, input=lines_of(*bodies)).returncode == 0
    read, write = os.pipe()
    tail = spawn_cli("tail", "--nsqd", nsqd.tcp, "--channel", "keep", topic, stdout=write)
    os.close(write)
    with os.fdopen(read, "rb") as reader:
        first = reader.readline()  # then the reader goes, like '| head -n 1'
    assert first.startswith(b"m") and first.endswith(b"x\n")
    status = wait_exit(tail, timeout=20)
    err = tail.stderr.read().decode()  # type: ignore[union-attr]
    assert status == 0 and err == "", err
    left = wait_for(lambda: _left_in(nsqd.http, topic, "keep"), what="nothing in flight")
    assert 0 < left < len(bodies)  # what was not printed stays (some went into the pipe)


def test_tail_of_a_quiet_topic_ends_once_the_reader_goes_away(classic_cluster):
    # '| head -n 2' on a topic where nothing more comes: tail does not wait for a next
    # message to learn that the reader is gone.
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_tail_quiet")
    create_channel(nsqd.http, topic, "keep")
    assert run_cli("pub", "--nsqd", nsqd.tcp, topic, input=lines_of("a", "b")).returncode == 0
    read, write = os.pipe()
    tail = spawn_cli("tail", "--nsqd", nsqd.tcp, "--channel", "keep", topic, stdout=write)
    os.close(write)
    with os.fdopen(read, "rb") as reader:
        assert [reader.readline(), reader.readline()] == [b"a\n", b"b\n"]
    assert wait_exit(tail, timeout=10) == 0
    assert tail.stderr.read() == b""  # type: ignore[union-attr]
