"""to-nsq against real nsqd: copy (replay) a topic, FIN only after the copy is acknowledged."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.cli.clihelp import lines_of, one_line_error, run_cli, spawn_cli, wait_exit
from tests.helpers import channel_stats, create_channel, topic_stats, unique, wait_for

pytestmark = pytest.mark.integration

NOWHERE = "127.0.0.1:1"


def _bodies(nsqd_tcp: str, topic: str, n: int) -> list[str]:
    tail = run_cli("tail", "--nsqd", nsqd_tcp, "--channel", "c", "-n", str(n), topic)
    assert tail.returncode == 0, tail.stderr
    return tail.stdout.decode().splitlines()


def test_to_nsq_replays_a_topic_and_finishes_only_copied_messages(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    src, dst = unique("cli_dead"), unique("cli_orders")
    create_channel(nsqd.http, src, "replay")
    create_channel(nsqd.http, dst, "c")
    bodies = [f"order-{i}" for i in range(200)]
    assert run_cli("pub", "--nsqd", nsqd.tcp, src, input=lines_of(*bodies)).returncode == 0

    # The destination is down: nothing is finished, everything stays in the source, and
    # copies failing again and again end the command with status 1 and the reason.
    down = run_cli(
        "to-nsq", src, "--nsqd", nsqd.tcp, "--channel", "replay", "--to", dst,
        "--to-nsqd", NOWHERE, "--json", "--producer-opt", "timeout=1", "--give-up-after", "2s",
    )  # fmt: skip
    assert down.returncode == 1, down.stderr
    err = down.stderr.decode()
    assert err.endswith("\n") and "failed in a row" in err.splitlines()[-1], err
    summary = json.loads(down.stdout)
    assert summary["published"] == 0 and summary["failed_attempts"] > 0
    assert (summary["ok"], summary["status"], summary["exit_status"]) == (False, "failed", 1)
    kept = channel_stats(nsqd.http, src, "replay")
    assert kept is not None and kept["message_count"] == 200
    assert kept["depth"] + kept["deferred_count"] + kept["in_flight_count"] == 200

    # Up again (the requeued ones come back after their delay: skip it with a fresh channel).
    create_channel(nsqd.http, src, "replay2")
    assert run_cli("pub", "--nsqd", nsqd.tcp, src, input=lines_of(*bodies)).returncode == 0
    started = time.monotonic()
    ok = run_cli(
        "to-nsq", src, "--nsqd", nsqd.tcp, "--channel", "replay2", "--to", dst,
        "--limit", "200", "--rate", "400", "--json",
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert time.monotonic() - started >= 0.45  # 200 at 400/s
    assert json.loads(ok.stdout) == {
        "from": src, "to": dst, "published": 200, "skipped": 0, "failed_attempts": 0,
        "last_error": None,
        "ok": True, "status": "ok", "exit_status": 0, "error": None,
    }  # fmt: skip
    done = channel_stats(nsqd.http, src, "replay2")
    assert done is not None and (done["depth"], done["in_flight_count"]) == (0, 0)
    assert sorted(_bodies(nsqd.tcp, dst, 200)) == sorted(bodies)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["t", "--nsqd", NOWHERE], ["--to names the same topic"]),
        (["--nsqd", NOWHERE, "--to", "x"], ["name a topic to copy"]),
        (["t", "--nsqd", NOWHERE, "--to", "x", "--producer-opt", "tls=1"], ["--tls"]),
    ],
)
def test_to_nsq_bad_input_is_one_line(args, needles):
    one_line_error(run_cli("to-nsq", *args), *needles)


def _copied(nsqd_http: str, topic: str) -> int:
    return int((topic_stats(nsqd_http, topic) or {}).get("message_count", 0))


def test_rate_limited_copies_never_time_out_nor_give_up_uncopied_messages(cluster_factory):
    # nsqd takes a message back after 1 s unanswered: a copy waiting for its --rate slot
    # must keep it (TOUCH, and few held at once), not let it be redelivered and given up.
    cluster = cluster_factory(nsqd=1, nsqd_args=["--msg-timeout=1s"])
    nsqd = cluster.nsqd[0]
    src, dst = unique("cli_slow_src"), unique("cli_slow_dst")
    create_channel(nsqd.http, src, "copy")
    create_channel(nsqd.http, dst, "c")
    bodies = [f"m{i:03d}" for i in range(40)]
    assert run_cli("pub", "--nsqd", nsqd.tcp, src, input=lines_of(*bodies)).returncode == 0
    result = run_cli(
        "to-nsq", src, "--nsqd", nsqd.tcp, "--channel", "copy", "--to", dst,
        "--rate", "5", "--limit", "40", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["published"] == 40
    source = channel_stats(nsqd.http, src, "copy")
    assert source is not None
    assert (source["depth"], source["in_flight_count"], source["timeout_count"]) == (0, 0, 0)
    assert sorted(_bodies(nsqd.tcp, dst, 40)) == bodies  # each once: none lost, none twice
    assert _copied(nsqd.http, dst) == 40


def test_idle_time_builds_no_burst(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    src, dst = unique("cli_idle_src"), unique("cli_idle_dst")
    create_channel(nsqd.http, src, "copy")
    proc = spawn_cli(
        "to-nsq", src, "--nsqd", nsqd.tcp, "--channel", "copy", "--to", dst, "--rate", "5",
        "--limit", "10",
    )  # fmt: skip
    wait_for(lambda: (channel_stats(nsqd.http, src, "copy") or {}).get("clients"), what="reader")
    time.sleep(2.5)  # the scenario itself: idle at --rate 5 for 2.5 s (12 slots unused)
    started = time.monotonic()
    assert run_cli("pub", "--nsqd", nsqd.tcp, src, input=lines_of(*"abcdefghij")).returncode == 0
    early = []
    while _copied(nsqd.http, dst) < 10:
        assert time.monotonic() - started < 15, "not copied"
        early.append((time.monotonic() - started, _copied(nsqd.http, dst)))
        time.sleep(0.05)
    assert wait_exit(proc) == 0, proc.stderr.read()  # type: ignore[union-attr]
    # 10 copies at 5/s take at least 9 gaps of 0.2 s, however long it was idle before.
    assert time.monotonic() - started >= 1.7
    assert all(n <= 2 + 5 * t for t, n in early), early


def test_limit_not_reached_ends_after_the_idle_timeout_with_status_1(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    src, dst = unique("cli_few_src"), unique("cli_few_dst")
    create_channel(nsqd.http, src, "copy")
    assert run_cli("pub", "--nsqd", nsqd.tcp, src, input=lines_of("a", "b", "c")).returncode == 0
    result = run_cli(
        "to-nsq", src, "--nsqd", nsqd.tcp, "--channel", "copy", "--to", dst, "--limit", "5",
        "--idle-timeout", "1s", "--json", timeout=20,
    )  # fmt: skip
    err = one_line_error(result, "copied 3 of --limit 5", "1s")
    assert "smartnsq to-nsq: error:" in err
    summary = json.loads(result.stdout)
    assert summary["published"] == 3
    assert (summary["ok"], summary["status"], summary["exit_status"]) == (False, "failed", 1)
    assert _copied(nsqd.http, dst) == 3


def test_a_destination_topic_missing_behind_lookupd_is_created_on_classic(classic_cluster):
    # Needs a Producer that, through lookupd, publishes a topic no nsqd has yet to one of
    # lookupd's nodes (classic nsqd creates it).
    nsqd = classic_cluster.nsqd[0]
    lookupd = classic_cluster.lookupd[0]
    src, dst = unique("cli_new_src"), unique("cli_new_dst")
    create_channel(nsqd.http, src, "copy")
    bodies = [f"n{i}" for i in range(5)]
    assert run_cli("pub", "--nsqd", nsqd.tcp, src, input=lines_of(*bodies)).returncode == 0
    result = run_cli(
        "to-nsq", src, "--nsqd", nsqd.tcp, "--channel", "copy", "--to", dst,
        "--to-lookupd", lookupd.http, "--limit", "5", "--json", timeout=30,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["published"] == 5
    assert sorted(_bodies(nsqd.tcp, dst, 5)) == bodies


def test_max_attempts_without_a_dead_letter_topic_is_refused():
    args = ["t", "--nsqd", NOWHERE, "--to", "x", "--consumer-opt", "max_attempts=3"]
    one_line_error(run_cli("to-nsq", *args), "max_attempts", "dead_letter_topic")


@pytest.mark.parametrize("second", [False, True], ids=["one Ctrl-C", "two Ctrl-C"])
def test_ctrl_c_with_the_destination_stopped_is_bounded(cluster_factory, second):
    # A short message timeout on the source: what a hurried stop left unanswered comes back soon.
    source = cluster_factory(nsqd=1, nsqd_args=["--msg-timeout=3s"])
    destination = cluster_factory(nsqd=1)
    src, dst = source.nsqd[0], destination.nsqd[0]
    topic = unique("cli_stop")
    create_channel(src.http, topic, "copy")
    total = 3000
    bodies = [f"s{i}" for i in range(total)]
    assert run_cli("pub", "--nsqd", src.tcp, topic, input=lines_of(*bodies)).returncode == 0
    proc = spawn_cli(
        "to-nsq", topic, "--nsqd", src.tcp, "--channel", "copy", "--to-nsqd", dst.tcp,
        "--rate", "200", "--producer-opt", "timeout=2",
    )  # fmt: skip
    wait_for(lambda: _copied(dst.http, topic) >= 100, what="100 copied")
    os.kill(dst.pid, signal.SIGSTOP)  # the destination stops answering
    try:
        time.sleep(0.5)  # the scenario: copies sent to the silent nsqd wait for answers
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        if second:
            time.sleep(0.3)
            proc.send_signal(signal.SIGINT)
            started = time.monotonic()
        status = wait_exit(proc, timeout=20)
        took = time.monotonic() - started
    finally:
        os.kill(dst.pid, signal.SIGCONT)
    assert took < (1.0 if second else 2.0 + 1.0), took
    assert status in (1, 130), proc.stderr.read()  # type: ignore[union-attr]

    # Nothing lost: what is not in the destination is back in the source.
    def left() -> int | None:
        c = channel_stats(src.http, topic, "copy")
        if c is None or c["in_flight_count"]:
            return None
        return int(c["depth"] + c["deferred_count"])

    remaining = wait_for(lambda: left() is not None and (left(),), timeout=20, what="settled")
    assert remaining[0] + _copied(dst.http, topic) >= total


def test_a_destination_away_for_seconds_does_not_end_the_copy(cluster_factory):
    # The copies in flight all fail within a moment of the destination going away: an
    # outage that is over in seconds must not end the command (the campaign's seed 45, an
    # nsqd restarted).
    source = cluster_factory(nsqd=1)
    destination = cluster_factory(nsqd=1)
    src, dst = source.nsqd[0], destination.nsqd[0]
    topic = unique("cli_restart")
    create_channel(src.http, topic, "copy")
    total = 2000
    bodies = [f"r{i}" for i in range(total)]
    assert run_cli("pub", "--nsqd", src.tcp, topic, input=lines_of(*bodies)).returncode == 0
    proc = spawn_cli(
        "to-nsq", topic, "--nsqd", src.tcp, "--channel", "copy", "--to-nsqd", dst.tcp,
        "--rate", "400", "--limit", str(total), "--json", "--producer-opt", "timeout=0.5",
        "--consumer-opt", "requeue_delay=1",
    )  # fmt: skip
    wait_for(lambda: _copied(dst.http, topic) >= 100, what="100 copied")
    os.kill(dst.pid, signal.SIGSTOP)  # the destination stops answering for a while
    try:
        time.sleep(2.0)  # the scenario: an outage much shorter than --give-up-after
    finally:
        os.kill(dst.pid, signal.SIGCONT)
    status = wait_exit(proc, timeout=120)
    assert status == 0, proc.stderr.read()  # type: ignore[union-attr]
    summary = json.loads(proc.stdout.read())  # type: ignore[union-attr]
    assert summary["published"] == total and summary["failed_attempts"] > 0, summary
    assert _copied(dst.http, topic) >= total
