"""pub's to_nsq options: --delimiter, --delay (DPUB), --producer-opt."""

from __future__ import annotations

import json

import pytest

from tests.cli.clihelp import one_line_error, run_cli
from tests.helpers import channel_stats, create_channel, unique

pytestmark = pytest.mark.integration


def _read(nsqd_tcp: str, topic: str, n: int) -> list[bytes]:
    tail = run_cli("tail", "--nsqd", nsqd_tcp, "--channel", "c", "-n", str(n), "--json", topic)
    assert tail.returncode == 0, tail.stderr
    return [json.loads(line).get("body", "").encode() for line in tail.stdout.splitlines()]


@pytest.mark.parametrize(
    ("flag", "data", "bodies"),
    [
        (",", b"a,b,,c", [b"a", b"b", b"c"]),
        ("\\0", b"x\r\0y\0", [b"x\r", b"y"]),  # only a newline drops a \r before it
        ("\\t", b"1 2\t3\n4", [b"1 2", b"3\n4"]),
    ],
)
def test_delimiter_splits_the_input(classic_cluster, flag, data, bodies):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_delim")
    create_channel(nsqd.http, topic, "c")
    pub = run_cli("pub", "--nsqd", nsqd.tcp, "--delimiter", flag, "--json", topic, input=data)
    assert pub.returncode == 0, pub.stderr
    assert json.loads(pub.stdout)["published"] == len(bodies)
    assert _read(nsqd.tcp, topic, len(bodies)) == bodies


def test_delimiter_must_be_one_byte():
    result = run_cli("pub", "--nsqd", "127.0.0.1:1", "--delimiter", "ab", "t")
    one_line_error(result, "'ab' is not one byte")


def test_delay_publishes_deferred_messages(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_delay")
    create_channel(nsqd.http, topic, "c")
    pub = run_cli("pub", "--nsqd", nsqd.tcp, "--delay", "1m", topic, input=b"later\nlater2\n")
    assert pub.returncode == 0, pub.stderr
    c = channel_stats(nsqd.http, topic, "c")
    assert c is not None and c["deferred_count"] == 2 and c["depth"] == 0


def test_producer_opt_reaches_the_producer(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_popt")
    data = b"short\n" + b"x" * 100 + b"\n"
    args = ["pub", "--nsqd", nsqd.tcp, "--producer-opt", "max_message_size=50", topic]
    pub = run_cli(*args, input=data)
    # The line too large is refused before it is sent, naming the limit that was passed;
    # the other line of its batch is published.
    one_line_error(pub, "published 1 messages", "1 failed", "line 2", "max_message_size (50)")
    ok = run_cli("pub", "--nsqd", nsqd.tcp, "--producer-opt", "timeout=5s", topic, input=data)
    assert ok.returncode == 0, ok.stderr
