"""tail: a topic that does not exist yet, several topics, --print-topic, --consumer-opt."""

from __future__ import annotations

import json

import pytest

from tests.cli.clihelp import (
    LineReader,
    addresses,
    lines_of,
    one_line_error,
    run_cli,
    spawn_cli,
    wait_exit,
)
from tests.helpers import create_channel, topic_stats, unique, wait_for

pytestmark = pytest.mark.integration


def _channels(nsqd_http: str, topic: str) -> list[dict]:
    return list((topic_stats(nsqd_http, topic) or {}).get("channels") or [])


def _pub(nsqd_tcp: str, topic: str, *lines: str) -> None:
    pub = run_cli("pub", "--nsqd", nsqd_tcp, topic, input=lines_of(*lines))
    assert pub.returncode == 0, pub.stderr


def test_tail_says_a_missing_topic_was_not_found_and_waits_for_it(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_later")
    tail = spawn_cli("tail", *addresses(classic_cluster), "--channel", "c", "-n", "1", topic)
    err = LineReader(tail.stderr)
    (line,) = err.wait_for(1)
    assert b"TOPIC_NOT_FOUND" in line and topic.encode() in line and b"waiting" in line
    assert tail.poll() is None  # still waiting
    create_channel(nsqd.http, topic, "c")  # the topic appears (and keeps what is published)
    _pub(nsqd.tcp, topic, "hello")
    assert wait_exit(tail) == 0
    assert tail.stdout.read() == b"hello\n"  # type: ignore[union-attr]
    assert b"appeared" in err.wait_for(2)[1]


def test_tail_reads_several_topics_and_prints_the_topic(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    a, b = unique("cli_ta"), unique("cli_tb")
    tail = spawn_cli(
        "tail", "--nsqd", nsqd.tcp, "--topic", a, "--topic", b, "-n", "2", "--print-topic"
    )
    wait_for(lambda: _channels(nsqd.http, a) and _channels(nsqd.http, b), what="both channels")
    _pub(nsqd.tcp, a, "from a")
    _pub(nsqd.tcp, b, "from b")
    assert wait_exit(tail) == 0, tail.stderr.read()  # type: ignore[union-attr]
    lines = tail.stdout.read().decode().splitlines()  # type: ignore[union-attr]
    assert sorted(lines) == [f"{a}\tfrom a", f"{b}\tfrom b"]


def test_tail_json_with_print_topic_has_a_topic_field(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_tj")
    create_channel(nsqd.http, topic, "c")
    _pub(nsqd.tcp, topic, "x")
    tail = run_cli(
        "tail", "--nsqd", nsqd.tcp, "--channel", "c", "-n", "1", "--print-topic", "--json", topic
    )
    assert json.loads(tail.stdout) == {"topic": topic, "body": "x"}


def test_tail_stops_at_count_and_leaves_the_rest_on_a_shared_channel(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_tcount")
    create_channel(nsqd.http, topic, "c")
    _pub(nsqd.tcp, topic, *map(str, range(10)))
    tail = run_cli("tail", "--nsqd", nsqd.tcp, "--channel", "c", "-n", "3", topic)
    assert tail.returncode == 0 and len(tail.stdout.splitlines()) == 3
    rest = run_cli("tail", "--nsqd", nsqd.tcp, "--channel", "c", "-n", "7", topic)
    assert sorted(tail.stdout.splitlines() + rest.stdout.splitlines()) == sorted(
        str(i).encode() for i in range(10)
    )


def test_consumer_opt_passes_a_consumer_keyword_through(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_topt")
    spawn_cli("tail", "--nsqd", nsqd.tcp, "--consumer-opt", "client_id=tail-opt-test", topic)

    def client_ids() -> list[str]:
        return [c["client_id"] for ch in _channels(nsqd.http, topic) for c in ch["clients"]]

    assert wait_for(client_ids, what="tail's connection") == ["tail-opt-test"]


@pytest.mark.parametrize(
    ("opt", "needles"),
    [
        ("channel=x", ["--channel"]),
        ("max_in_flight=3", ["--max-in-flight"]),
        ("no_such=1", ["unknown option 'no_such'"]),
        ("max_attempts=many", ["max_attempts=many"]),
    ],
)
def test_bad_consumer_opt_is_one_line(opt, needles):
    result = run_cli("tail", "--nsqd", "127.0.0.1:1", "--consumer-opt", opt, "t")
    one_line_error(result, "--consumer-opt", *needles)
