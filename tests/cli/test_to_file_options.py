"""to-file's nsq_to_file options: work and output directories, gzip level, file names,
several topics and a topic pattern, consumer options, a topic that does not exist yet."""

from __future__ import annotations

import gzip
import json
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.cli.clihelp import LineReader, addresses, lines_of, run_cli, spawn_cli, wait_exit
from tests.helpers import (
    channel_stats,
    create_channel,
    settled,
    topic_stats,
    unique,
    wait_for,
)

pytestmark = pytest.mark.integration

CHANNEL = "archive"


def _publish(nsqd_tcp: str, topic: str, bodies: list[str]) -> None:
    pub = run_cli("pub", "--nsqd", nsqd_tcp, topic, input=lines_of(*bodies))
    assert pub.returncode == 0, pub.stderr


def _all_finished(nsqd_http: str, topic: str) -> bool:
    t = topic_stats(nsqd_http, topic)
    return (
        t is not None and t["depth"] == 0 and settled(nsqd_http, topic, CHANNEL, t["message_count"])
    )


def _stop(proc) -> dict:
    proc.send_signal(signal.SIGTERM)
    assert wait_exit(proc) == 143, proc.stderr.read()
    return json.loads(proc.stdout.read())


def _gz_lines(path: Path) -> list[bytes]:
    return gzip.decompress(path.read_bytes()).splitlines()  # fails on an unfinished file


def test_work_dir_holds_the_open_file_and_output_dir_only_finished_ones(classic_cluster, tmp_path):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_workdir")
    bodies = [f"line-{i:04d}" for i in range(400)]
    _publish(nsqd.tcp, topic, bodies)
    work, out = tmp_path / "work", tmp_path / "out"
    proc = spawn_cli(
        "to-file", "--nsqd", nsqd.tcp, "--channel", CHANNEL, "--work-dir", str(work),
        "--output-dir", str(out), "--gzip", "--rotate-size", "1K", "--json", topic,
    )  # fmt: skip
    wait_for(lambda: _all_finished(nsqd.http, topic), what="every message written")
    finished = sorted(out.iterdir())
    assert len(finished) >= 2  # rotated: those are complete and moved
    assert len(list(work.iterdir())) == 1  # the one still open
    assert all(_gz_lines(f) for f in finished)  # complete gzip files, trailer included
    summary = _stop(proc)
    assert list(work.iterdir()) == []
    files = sorted(out.iterdir())
    assert sorted(summary["files"]) == [str(f) for f in files]
    assert sorted(line for f in files for line in _gz_lines(f)) == [b.encode() for b in bodies]


@pytest.mark.parametrize(("level", "xfl"), [(1, 4), (9, 2)])
def test_gzip_level_is_used_and_implies_gzip(classic_cluster, tmp_path, level, xfl):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_gzlevel")
    _publish(nsqd.tcp, topic, ["a" * 100] * 10)
    proc = spawn_cli(
        "to-file", "--nsqd", nsqd.tcp, "--channel", CHANNEL, "--dir", str(tmp_path),
        "--gzip-level", str(level), "--json", topic,
    )  # fmt: skip
    wait_for(lambda: _all_finished(nsqd.http, topic), what="every message written")
    _stop(proc)
    (path,) = tmp_path.iterdir()
    assert path.name.endswith(".gz")
    assert path.read_bytes()[8] == xfl  # gzip's header: 4 = fastest, 2 = best compression
    assert _gz_lines(path) == [b"a" * 100] * 10


def test_go_filename_format_datetime_format_and_host_identifier(classic_cluster, tmp_path):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_names")
    _publish(nsqd.tcp, topic, ["x"])
    proc = spawn_cli(
        "to-file", "--nsqd", nsqd.tcp, "--channel", CHANNEL, "--dir", str(tmp_path),
        "--filename-format", "<TOPIC>.<HOST><REV>.<DATETIME>.log", "--datetime-format", "%Y",
        "--host-identifier", "box-<SHORT_HOST>", "--json", topic,
    )  # fmt: skip
    wait_for(lambda: _all_finished(nsqd.http, topic), what="the message written")
    _stop(proc)
    short = socket.gethostname().split(".")[0]
    year = time.strftime("%Y")
    assert [p.name for p in tmp_path.iterdir()] == [f"{topic}.box-{short}.{year}.log"]


def test_skip_empty_files_leaves_no_file_when_nothing_arrives(classic_cluster, tmp_path):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_empty")
    create_channel(nsqd.http, topic, CHANNEL)
    proc = spawn_cli(
        "to-file", "--nsqd", nsqd.tcp, "--channel", CHANNEL, "--dir", str(tmp_path),
        "--skip-empty-files", "--json", topic,
    )  # fmt: skip
    wait_for(lambda: channel_stats(nsqd.http, topic, CHANNEL)["clients"], what="subscribed")
    assert _stop(proc)["written"] == 0
    assert list(tmp_path.iterdir()) == []


def test_several_topics_and_a_topic_pattern_with_new_topics_followed(classic_cluster, tmp_path):
    nsqd = classic_cluster.nsqd[0]
    prefix = unique("cli_pat")
    a, b, other = f"{prefix}_a", f"{prefix}_b", unique("cli_other")
    for topic in (a, b, other):
        create_channel(nsqd.http, topic, CHANNEL)  # known to lookupd from now on
        _publish(nsqd.tcp, topic, [f"{topic}-1"])
    proc = spawn_cli(
        "to-file", *addresses(classic_cluster), "--channel", CHANNEL, "--dir", str(tmp_path),
        "--topic-pattern", f"^{prefix}_", "--topic-refresh", "1s", "--json",
        "--pattern", "{topic}.log",
    )  # fmt: skip
    wait_for(lambda: _all_finished(nsqd.http, a) and _all_finished(nsqd.http, b), what="a, b")
    c = f"{prefix}_c"  # appears while it runs
    create_channel(nsqd.http, c, CHANNEL)
    _publish(nsqd.tcp, c, [f"{c}-1"])
    wait_for(lambda: _all_finished(nsqd.http, c), timeout=20, what="the new topic archived")
    summary = _stop(proc)
    assert sorted(summary["topics"]) == [a, b, c]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{t}.log" for t in (a, b, c)]
    assert (tmp_path / f"{c}.log").read_text() == f"{c}-1\n"
    assert channel_stats(nsqd.http, other, CHANNEL)["depth"] == 1  # not matched: untouched

    # Several --topic flags (and a TOPIC argument) without a pattern.
    for topic in (a, b):
        _publish(nsqd.tcp, topic, [f"{topic}-2"])
    named = tmp_path / "named"
    proc = spawn_cli(
        "to-file", "--nsqd", nsqd.tcp, "--channel", CHANNEL, "--dir", str(named),
        "--pattern", "{topic}.log", "--topic", a, "--json", b,
    )  # fmt: skip
    wait_for(lambda: _all_finished(nsqd.http, a) and _all_finished(nsqd.http, b), what="a, b")
    assert sorted(_stop(proc)["topics"]) == [a, b]
    assert (named / f"{b}.log").read_text() == f"{b}-2\n"


def test_to_file_reports_a_missing_topic_and_passes_consumer_options(classic_cluster, tmp_path):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_file_later")
    proc = spawn_cli(
        "to-file", *addresses(classic_cluster), "--channel", CHANNEL, "--dir", str(tmp_path),
        "--consumer-opt", "client_id=archiver-7", "--json", topic,
    )  # fmt: skip
    err = LineReader(proc.stderr)
    assert b"TOPIC_NOT_FOUND" in err.wait_for(1)[0]
    create_channel(nsqd.http, topic, CHANNEL)
    _publish(nsqd.tcp, topic, ["late"])
    wait_for(lambda: _all_finished(nsqd.http, topic), timeout=20, what="the message written")
    clients = channel_stats(nsqd.http, topic, CHANNEL)["clients"]
    assert [c["client_id"] for c in clients] == ["archiver-7"]
    proc.send_signal(signal.SIGTERM)
    assert wait_exit(proc) == 143
    assert json.loads(proc.stdout.read())["written"] == 1  # type: ignore[union-attr]
    assert (topic_stats(nsqd.http, topic) or {})["message_count"] == 1


def test_topic_pattern_without_lookupd_is_a_usage_error(tmp_path):
    result = run_cli("to-file", "--nsqd", "127.0.0.1:1", "--dir", str(tmp_path),
                     "--topic-pattern", "x")  # fmt: skip
    assert result.returncode == 2 and b"--topic-pattern needs --lookupd" in result.stderr
