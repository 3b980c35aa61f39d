"""pub's Ctrl-C with nsqd not answering (SIGSTOP): bounded, and the report separates what nsqd
acknowledged, what was sent without an answer, and what was never sent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.cli.clihelp import connected_to, spawn_cli, wait_exit
from tests.helpers import topic_stats, unique, wait_for

pytestmark = pytest.mark.integration

TIMEOUT = 2.0  # the publish timeout given to pub


def _count(nsqd_http: str, topic: str) -> int:
    return int((topic_stats(nsqd_http, topic) or {}).get("message_count", 0))


@pytest.mark.parametrize("second", [False, True], ids=["one Ctrl-C", "two Ctrl-C"])
def test_ctrl_c_with_nsqd_stopped_is_bounded_and_reports_the_unknown(cluster_factory, second):
    cluster = cluster_factory(nsqd=1)
    nsqd = cluster.nsqd[0]
    topic = unique("cli_stalled")
    seq = subprocess.Popen(["seq", "1", "1000000"], stdout=subprocess.PIPE)
    pub = spawn_cli(
        "pub", "--nsqd", nsqd.tcp, "--rate", "1000", "--json", "--producer-opt",
        f"timeout={TIMEOUT}", topic, stdin=seq.stdout,
    )  # fmt: skip
    assert seq.stdout is not None
    seq.stdout.close()
    try:
        wait_for(lambda: _count(nsqd.http, topic) >= 200, what="200 published")
        os.kill(nsqd.pid, signal.SIGSTOP)
        time.sleep(0.5)  # the scenario: nsqd silent while batches go out (20 a second)
        pub.send_signal(signal.SIGINT)
        first = time.monotonic()
        if second:
            time.sleep(0.3)
            pub.send_signal(signal.SIGINT)
            again = time.monotonic()
            status = wait_exit(pub, timeout=15)
            assert time.monotonic() - again < 1.0
        else:
            status = wait_exit(pub, timeout=15)
            assert time.monotonic() - first < TIMEOUT + 1.0
    finally:
        os.kill(nsqd.pid, signal.SIGCONT)
        seq.kill()
        seq.wait(10)
    err = pub.stderr.read().decode()  # type: ignore[union-attr]
    assert status == 1, err  # a batch without an answer: not everything asked was done
    summary = json.loads(pub.stdout.read().splitlines()[-1])  # type: ignore[union-attr]
    assert summary["interrupted"] and summary["status"] == "failed"
    acked, unknown = summary["acknowledged"], summary["unknown"]
    assert acked >= 200 and unknown > 0 and summary["failed"] == 0
    assert summary["resume_from"] == str(acked)  # every line up to it acknowledged
    # What nsqd holds once it runs again: all acknowledged, and maybe some of the unknown.
    wait_for(lambda: _count(nsqd.http, topic) >= acked, what="nsqd answering again")
    assert acked <= _count(nsqd.http, topic) <= acked + unknown


def test_ctrl_c_while_lookupd_does_not_answer_says_one_line(cluster_factory, tmp_path):
    # The input reader must not hand a line to a publisher that is gone: no "coroutine was
    # never awaited" warning next to the report.
    cluster = cluster_factory(nsqd=1)
    lookupd = cluster.lookupd[0]
    data = tmp_path / "lines.txt"
    data.write_bytes(b"".join(b"%d\n" % i for i in range(100000)))
    os.kill(lookupd.pid, signal.SIGSTOP)
    try:
        pub = spawn_cli("pub", "--lookupd", lookupd.http, unique("cli_stalledlk"), str(data))
        wait_for(lambda: connected_to(lookupd.http), what="the lookup under way")
        pub.send_signal(signal.SIGINT)
        status = wait_exit(pub, timeout=15)
    finally:
        os.kill(lookupd.pid, signal.SIGCONT)
    err = pub.stderr.read().decode()  # type: ignore[union-attr]
    assert status == 1, err
    assert len(err.splitlines()) == 1 and "interrupted" in err, err
