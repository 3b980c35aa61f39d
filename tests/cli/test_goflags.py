"""NSQ's Go utilities' command lines run unchanged but for the command's name, against real
nsqd. Each line is NSQ's own: the quick start's nsq_to_file line (nsq.io, overview/quick_start)
and, for the others, the flags of each utility's usage (nsq.io, components/utilities), in
Go's spellings (``-flag=value``, ``--flag=value``, ``-flag value``, ``--switch=true``)."""

from __future__ import annotations

import json
import shlex
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.cli.clihelp import lines_of, run_cli, spawn_cli, wait_exit
from tests.cli.test_to_http import endpoint
from tests.helpers import channel_stats, create_channel, settled, unique, wait_for

pytestmark = pytest.mark.integration


def _go(line: str, cluster: Any, **names: str) -> list[str]:
    """A Go utility's command line as smartnsq's arguments: the name replaced, NSQ's docs'
    addresses pointed at the test cluster, ``{name}`` fields filled in."""
    line = line.format(**names)
    line = line.replace("127.0.0.1:4161", cluster.lookupd[0].http)
    line = line.replace("127.0.0.1:4151", cluster.nsqd[0].http)
    line = line.replace("127.0.0.1:4150", cluster.nsqd[0].tcp)
    return shlex.split(line)[1:]  # the Go utility's name: the test gives smartnsq's command


def test_to_nsq_line_runs_as_pub(classic_cluster):
    topic = unique("go_to_nsq")
    create_channel(classic_cluster.nsqd[0].http, topic, "c")
    args = _go(
        "to_nsq -topic={topic} -nsqd-tcp-address=127.0.0.1:4150 -rate=0 -delimiter=,",
        classic_cluster,
        topic=topic,
    )
    result = run_cli("pub", *args, input=b"a,b,c")
    assert result.returncode == 0, result.stderr
    stats = channel_stats(classic_cluster.nsqd[0].http, topic, "c")
    assert stats is not None and stats["depth"] == 3


def test_nsq_tail_line_runs_as_tail(classic_cluster):
    topic = unique("go_tail")
    nsqd = classic_cluster.nsqd[0]
    create_channel(nsqd.http, topic, "c")
    assert run_cli("pub", "--nsqd", nsqd.tcp, topic, input=lines_of("x", "y", "z")).returncode == 0
    args = _go(
        "nsq_tail --topic={topic} --channel=c --lookupd-http-address=127.0.0.1:4161 "
        "-n 3 --print-topic --max-in-flight=10 --consumer-opt=max_attempts=3"
        " --consumer-opt=output_buffer_timeout=25ms -consumer-opt output_buffer_size=4096",
        classic_cluster,
        topic=topic,
    )
    result = run_cli("tail", *args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().splitlines() == [f"{topic}\t{b}" for b in "xyz"]


def test_nsq_to_file_quick_start_line_runs_as_to_file(classic_cluster, tmp_path: Path):
    topic = unique("go_to_file")
    nsqd = classic_cluster.nsqd[0]
    published = run_cli("pub", "--nsqd", nsqd.tcp, topic, input=lines_of("hello world 1"))
    assert published.returncode == 0
    # The quick start's line, then more of nsq_to_file's flags in Go's forms.
    line = (
        "nsq_to_file --topic={topic} --output-dir={dir} --lookupd-http-address=127.0.0.1:4161"
        " -sync-interval=1s -topic-refresh=1m0s -rotate-size=0 -rotate-interval 0"
        " -gzip=false -skip-empty-files=true -log-level=info -log-prefix=[nsq_to_file]"
        " -http-client-connect-timeout=2s -http-client-request-timeout 5s"
    )
    proc = spawn_cli("to-file", *_go(line, classic_cluster, topic=topic, dir=str(tmp_path)))
    wait_for(lambda: settled(nsqd.http, topic, "nsq_to_file", 1), what="the message written")
    proc.send_signal(signal.SIGTERM)
    status = wait_exit(proc)
    assert status == 143, proc.stderr.read()  # type: ignore[union-attr]
    (log,) = [p for p in tmp_path.iterdir() if p.name.startswith(f"{topic}.")]
    assert log.read_text() == "hello world 1\n"
    assert not log.name.endswith(".gz")


def test_nsq_to_http_line_runs_as_to_http(classic_cluster):
    topic = unique("go_to_http")
    nsqd = classic_cluster.nsqd[0]
    create_channel(nsqd.http, topic, "nsq_to_http")
    assert run_cli("pub", "--nsqd", nsqd.tcp, topic, input=lines_of("p", "q")).returncode == 0
    with endpoint() as web:
        line = (
            "nsq_to_http -topic={topic} -lookupd-http-address=127.0.0.1:4161 -post={url}"
            " -content-type=text/plain -header=X-From:go -mode=round-robin -n=4 -sample=1"
            " -status-every=0 -max-in-flight=10 -http-client-connect-timeout=2s"
            " -http-client-request-timeout=20s -consumer-opt=max_attempts=0"
        )
        proc = spawn_cli("to-http", *_go(line, classic_cluster, topic=topic, url=web.url))
        wait_for(lambda: len(web.delivered()) == 2, what="both messages posted")
        wait_for(lambda: settled(nsqd.http, topic, "nsq_to_http", 2), what="both finished")
        proc.send_signal(signal.SIGINT)
        assert wait_exit(proc) == 130
        assert sorted(web.delivered()) == ["p", "q"]
        assert {r["headers"]["x-from"] for r in web.requests} == {"go"}
        assert {r["headers"]["content-type"] for r in web.requests} == {"text/plain"}


def test_nsq_stat_line_runs_as_stat(classic_cluster):
    topic = unique("go_stat")
    nsqd = classic_cluster.nsqd[0]
    create_channel(nsqd.http, topic, "c")
    assert run_cli("pub", "--nsqd", nsqd.tcp, topic, input=lines_of("s")).returncode == 0
    args = _go(
        "nsq_stat -topic={topic} -channel=c -lookupd-http-address=127.0.0.1:4161"
        " -nsqd-http-address=127.0.0.1:4151 -interval=1s -count=1"
        " -http-client-connect-timeout=2s -http-client-request-timeout=5s",
        classic_cluster,
        topic=topic,
    )
    result = run_cli("stat", *args, "--json")
    assert result.returncode == 0, result.stderr
    assert topic in result.stdout.decode()


@pytest.mark.parametrize("command", ["pub", "tail", "to-file", "to-nsq", "to-http", "stat"])
def test_every_command_answers_go_version_flag(command):
    for spelling in ("--version", "-version"):
        result = run_cli(command, spelling)
        assert result.returncode == 0, result.stderr
        assert result.stdout.decode().startswith(f"smartnsq {command} v")


@pytest.mark.parametrize(
    ("command", "args", "needle"),
    [
        ("stat", ["-interval=2x"], "not a duration"),
        ("to-file", ["t", "--output-dir=/tmp", "-log-level=loud"], "--log-level"),
        ("to-file", ["t", "--output-dir=/tmp", "-http-client-connect-timeout=soon"], "duration"),
        ("tail", ["t", "-print-topic=maybe"], "--print-topic"),
    ],
)
def test_go_flags_with_bad_values_are_refused(command, args, needle):
    result = run_cli(command, "--nsqd", "127.0.0.1:1", *args)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr.decode()


def test_nsq_to_nsq_line_runs_as_to_nsq_with_json_filters_and_two_topics(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    first, second, dst = unique("go_src1"), unique("go_src2"), unique("go_dst")
    create_channel(nsqd.http, dst, "c")
    for topic, bodies in (
        (first, ['{"kind": "order", "id": 1, "secret": "x"}', '{"kind": "refund", "id": 2}',
                 "not json", '["kind"]']),
        (second, ['{"kind": "order", "id": 3.0, "note": "é"}', '{"id": 4}',
                  '{"kind": 7, "id": 5}']),
    ):  # fmt: skip
        create_channel(nsqd.http, topic, "nsq_to_nsq")
        assert run_cli("pub", "--nsqd", nsqd.tcp, topic, input=lines_of(*bodies)).returncode == 0
    line = (
        "nsq_to_nsq --topic={first} --topic={second} --nsqd-tcp-address=127.0.0.1:4150"
        " --destination-nsqd-tcp-address=127.0.0.1:4150 --destination-topic={dst}"
        " --require-json-field=kind --require-json-value=order"
        " --whitelist-json-field=id --whitelist-json-field=kind --whitelist-json-field=note"
        " --mode=round-robin --status-every=0 --max-in-flight=10 --consumer-opt=max_attempts=0"
    )
    args = _go(line, classic_cluster, first=first, second=second, dst=dst)
    proc = spawn_cli("to-nsq", *args, "--json")
    wait_for(lambda: settled(nsqd.http, first, "nsq_to_nsq", 4), what="the first topic done")
    wait_for(lambda: settled(nsqd.http, second, "nsq_to_nsq", 3), what="the second topic done")
    wait_for(lambda: settled_count(nsqd.http, dst, 2), what="the two copies")
    proc.send_signal(signal.SIGTERM)
    wait_exit(proc)
    summary = json.loads(proc.stdout.read())  # type: ignore[union-attr]
    assert (summary["published"], summary["skipped"]) == (2, 5)
    tail = run_cli("tail", "--nsqd", nsqd.tcp, "--channel", "c", "-n", "2", dst)
    assert tail.returncode == 0, tail.stderr
    assert sorted(tail.stdout.decode().splitlines()) == [
        '{"id":1,"kind":"order"}',
        '{"id":3,"kind":"order","note":"é"}',
    ]


def settled_count(http: str, topic: str, count: int) -> bool:
    stats = channel_stats(http, topic, "c") or {}
    return stats.get("message_count") == count and stats.get("depth") == count
