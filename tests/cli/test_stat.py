"""stat against a real classic cluster (the Youzan side is in test_youzan.py)."""

from __future__ import annotations

import json
import os
import signal

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
from tests.helpers import create_channel, listed_producers, unique, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def busy_topic(classic_cluster):
    """A topic with 5 messages and a channel 'c' that has finished 2 of them."""
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_stat")
    pub = run_cli("pub", "--nsqd", nsqd.tcp, topic, input=lines_of(*"abcde"))
    assert pub.returncode == 0, pub.stderr
    tail = run_cli("tail", "--nsqd", nsqd.tcp, "--channel", "c", "-n", "2", topic)
    assert tail.stdout == b"a\nb\n", tail.stderr
    return topic


def test_stat_json_shows_nodes_topics_and_channels_from_lookupd(classic_cluster, busy_topic):
    nsqd = classic_cluster.nsqd[0]
    result = run_cli("stat", *addresses(classic_cluster), "--json", "--interval", "0.2", busy_topic)
    assert result.returncode == 0, result.stderr
    snap = json.loads(result.stdout)
    (node,) = snap["nodes"]
    assert node["tcp"] == nsqd.tcp and node["http"] == nsqd.http and node["health"] == "OK"
    (topic,) = snap["topics"]
    assert topic["topic"] == busy_topic and not topic["partitioned"]
    assert topic["messages"] == 5 and topic["rate"] == 0
    assert [n["leader"] for n in topic["nodes"]] == [nsqd.tcp]
    (channel,) = topic["channels"]
    assert channel["channel"] == "c"
    assert (channel["depth"], channel["in_flight"], channel["messages"]) == (3, 0, 5)
    assert channel["lag"] == 3 and "lag_by_partition" not in channel


def test_stat_lag_counts_in_flight_and_deferred_on_classic(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_statlag")
    create_channel(nsqd.http, topic, "c")
    assert run_cli("pub", "--nsqd", nsqd.tcp, topic, input=lines_of(*"abcd")).returncode == 0
    # DPUB: deferred messages are not in depth, but the channel has not consumed them
    assert (
        run_cli("pub", "--nsqd", nsqd.tcp, "--delay", "60", topic, input=lines_of("e")).returncode
        == 0
    )
    result = run_cli("stat", "--nsqd-http", nsqd.http, "--json", "--interval", "0.1", topic)
    assert result.returncode == 0, result.stderr
    ((channel,),) = [t["channels"] for t in json.loads(result.stdout)["topics"]]
    assert (channel["depth"], channel["deferred"], channel["lag"]) == (4, 1, 5)


def test_stat_table_is_readable(classic_cluster, busy_topic):
    nsqd = classic_cluster.nsqd[0]
    result = run_cli("stat", "--nsqd-http", nsqd.http, "--interval", "0.2")
    assert result.returncode == 0, result.stderr
    rows = result.stdout.decode().splitlines()
    assert any(nsqd.http in row and "OK" in row for row in rows)
    channel_row = next(row for row in rows if busy_topic in row and " c " in row)
    assert channel_row.split("│")[3].strip() == "3"  # the lag column
    assert channel_row.split("│")[4].strip() == "-"  # no partitions
    assert channel_row.split("│")[5].strip() == "3"  # the depth column


def test_stat_of_an_unknown_topic_is_an_error(classic_cluster):
    result = run_cli("stat", *addresses(classic_cluster), "--interval", "0.1", "nope_nope")
    assert result.returncode == 1
    assert result.stderr.decode().strip() == "smartnsq stat: error: no nsqd has topic 'nope_nope'"


def test_stat_watch_reports_the_publish_rate_until_ctrl_c(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_watch")
    assert run_cli("pub", "--nsqd", nsqd.tcp, topic, input=b"first\n").returncode == 0
    watch = spawn_cli(
        "stat", "--nsqd-http", nsqd.http, "--watch", "--json", "--interval", "0.3", topic
    )
    reader = LineReader(watch.stdout)
    reader.wait_for(1)
    assert run_cli("pub", "--nsqd", nsqd.tcp, topic, input=lines_of(*"x" * 30)).returncode == 0

    def rates() -> list[float]:
        return [json.loads(line)["topics"][0]["rate"] for line in reader.lines]

    # Some refresh saw the 30 messages arrive: a positive rate.
    n = len(reader.lines)
    while not any(r > 0 for r in rates()):
        n += 1
        reader.wait_for(n)
    watch.send_signal(signal.SIGINT)
    assert wait_exit(watch) == 130  # stopped by Ctrl-C, as every command
    assert json.loads(reader.lines[-1])["topics"][0]["messages"] == 31


def test_stat_brackets_ipv6_addresses_from_lookupd(cluster_factory):
    # nsqd announces ::1 to lookupd; it listens on 127.0.0.1 only, so its /stats cannot be
    # read at the announced address: what matters here is how the address is written and
    # that it was tried as an address (a refused connection, not a malformed URL).
    cluster = cluster_factory(kind="classic", nsqd=1, nsqd_args=["--broadcast-address=::1"])
    nsqd = cluster.nsqd[0]
    result = run_cli("stat", *addresses(cluster), "--json", "--nsqd-http", nsqd.http)
    assert result.returncode == 0, result.stderr
    nodes = {n["http"]: n for n in json.loads(result.stdout)["nodes"]}
    http_port, tcp_port = nsqd.http.rpartition(":")[2], nsqd.tcp.rpartition(":")[2]
    v6 = nodes[f"[::1]:{http_port}"]
    assert v6["tcp"] == f"[::1]:{tcp_port}"
    assert "refused" in v6["error"].lower() or "connect" in v6["error"].lower(), v6["error"]
    assert nodes[nsqd.http]["health"] == "OK"
    table = run_cli("stat", *addresses(cluster), "--nsqd-http", nsqd.http, "--interval", "0.1")
    assert f"[::1]:{tcp_port}" in table.stdout.decode(), table.stdout


def test_stat_channel_count_and_memory_disk_depth(cluster_factory):
    # A memory queue of 2 messages: the rest of the depth is on disk.
    cluster = cluster_factory(kind="classic", nsqd=1, nsqd_args=["--mem-queue-size=2"])
    nsqd = cluster.nsqd[0]
    topic = unique("cli_statdisk")
    create_channel(nsqd.http, topic, "keep")
    create_channel(nsqd.http, topic, "other")
    assert run_cli("pub", "--nsqd", nsqd.tcp, topic, input=lines_of(*"abcde")).returncode == 0
    result = run_cli(
        "stat", "--nsqd-http", nsqd.http, "--json", "--interval", "0.1", "--count", "2",
        "--topic", topic, "--channel", "keep",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    reports = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(reports) == 2  # --count reports, then it exits
    (t,) = reports[-1]["topics"]
    (c,) = t["channels"]  # only --channel
    assert c["channel"] == "keep"
    assert (c["depth"], c["memory_depth"], c["disk_depth"]) == (5, 2, 3)
    assert c["egress_rate"] == 0
    table = run_cli("stat", "--nsqd-http", nsqd.http, "--interval", "0.1", "--channel", "keep")
    header = next(row for row in table.stdout.decode().splitlines() if "in flight" in row)
    assert [h.strip() for h in header.split("┃")[3:8]] == [
        "lag", "by partition", "depth", "mem", "disk"
    ]  # fmt: skip
    assert "other" not in table.stdout.decode()
    missing = run_cli("stat", "--nsqd-http", nsqd.http, "--interval", "0.1", "--channel", "nope")
    assert b"no topic shown has channel 'nope'" in missing.stderr


def test_stat_of_a_topic_whose_nsqd_does_not_answer_says_so(cluster_factory):
    # Two nsqd, the topic on the one that is stopped: not "no nsqd has topic", but which nsqd
    # did not answer.
    cluster = cluster_factory(nsqd=2)
    nsqd = cluster.nsqd[0]
    topic = unique("cli_statstopped")
    assert run_cli("pub", "--nsqd", nsqd.tcp, topic, input=lines_of("a")).returncode == 0
    wait_for(lambda: listed_producers(cluster.lookupd[0].http, topic), what="lookupd lists it")
    os.kill(nsqd.pid, signal.SIGSTOP)
    try:
        result = run_cli("stat", *addresses(cluster), "--interval", "0.1", topic)
    finally:
        os.kill(nsqd.pid, signal.SIGCONT)
    err = one_line_error(result, topic, nsqd.http)
    assert "no nsqd has topic" not in err, err
