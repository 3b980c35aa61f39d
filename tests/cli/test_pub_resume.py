"""pub's Ctrl-C: stop sending at once, report what nsqd acknowledged, resume from it."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.cli.clihelp import cli_env, lines_of, run_cli, spawn_cli, wait_exit
from tests.helpers import create_channel, topic_stats, unique, wait_for

pytestmark = pytest.mark.integration

TOTAL = 3000  # ~14 KB: one read of the input holds all of it


def _count(nsqd_http: str, topic: str) -> int:
    return int((topic_stats(nsqd_http, topic) or {}).get("message_count", 0))


def _seq(n: int) -> subprocess.Popen[bytes]:
    """``seq 1 n`` as a separate process, as a user's pipe would be."""
    return subprocess.Popen(["seq", "1", str(n)], stdout=subprocess.PIPE)


def _all_bodies(nsqd_tcp: str, topic: str, n: int) -> list[int]:
    tail = run_cli("tail", "--nsqd", nsqd_tcp, "--channel", "all", "-n", str(n), topic)
    assert tail.returncode == 0, tail.stderr
    return [int(line) for line in tail.stdout.splitlines()]


def test_first_ctrl_c_stops_sending_and_the_resume_point_publishes_exactly_the_rest(
    classic_cluster,
):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_resume")
    create_channel(nsqd.http, topic, "all")  # keeps every message for the check at the end
    seq = _seq(TOTAL)
    pub = spawn_cli("pub", "--nsqd", nsqd.tcp, "--rate", "300", topic, stdin=seq.stdout)
    assert seq.stdout is not None
    seq.stdout.close()
    wait_for(
        lambda: _count(nsqd.http, topic) >= 100 or pub.poll() is not None, what="100 published"
    )
    assert pub.poll() is None, pub.stderr.read()  # type: ignore[union-attr]
    pub.send_signal(signal.SIGINT)
    stopped = time.monotonic()
    # One Ctrl-C is enough, and it does not take the rest of what was read (10 s at this rate).
    assert wait_exit(pub, timeout=5) == 130
    assert time.monotonic() - stopped < 2.0
    seq.wait(10)
    err = pub.stderr.read().decode()  # type: ignore[union-attr]
    assert "Traceback" not in err and "Error" not in err, err
    (line,) = err.splitlines()
    m = re.fullmatch(
        rf"smartnsq pub: interrupted: published (\d+) messages to {topic}"
        r"(?:, \d+ read but not sent)?; "
        r"acknowledged up to <stdin>:(\d+): go on with --resume-from (\d+)",
        line,
    )
    assert m, line
    published, acked, resume = map(int, m.groups())
    assert published == acked == resume < TOTAL - 1000
    assert _count(nsqd.http, topic) == published  # nothing sent after the report was made

    seq = _seq(TOTAL)
    again = spawn_cli(
        "pub", "--nsqd", nsqd.tcp, "--resume-from", str(resume), "--json", topic, stdin=seq.stdout
    )
    assert seq.stdout is not None
    seq.stdout.close()
    assert wait_exit(again) == 0, again.stderr.read()  # type: ignore[union-attr]
    summary = json.loads(again.stdout.read())  # type: ignore[union-attr]
    assert summary["published"] == TOTAL - resume
    bodies = sorted(_all_bodies(nsqd.tcp, topic, TOTAL))
    assert bodies == list(range(1, TOTAL + 1))  # no gap, no line twice
    assert _count(nsqd.http, topic) == TOTAL


# Python itself and the smartnsq package are loaded first; the marker line then says the
# command line is about to load. A signal before that is the interpreter's business.
STARTER = (
    "import os, runpy, sys, smartnsq; sys.argv = ['smartnsq', *sys.argv[1:]]; "
    "os.write(2, b'loading\\n'); runpy.run_module('smartnsq', run_name='__main__')"
)


@pytest.mark.parametrize("after", [0.05, 0.2, 0.5, 1.0])
def test_ctrl_c_at_any_moment_of_start_up_exits_130_without_a_traceback(classic_cluster, after):
    # Timed on purpose: the point is a signal that lands while modules are still loading.
    nsqd = classic_cluster.nsqd[0]
    args = ["pub", "--nsqd", nsqd.tcp, unique("cli_early")]
    pub = subprocess.Popen(
        [sys.executable, "-c", STARTER, *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(),
    )  # fmt: skip
    try:
        assert pub.stderr is not None
        assert pub.stderr.readline() == b"loading\n"
        time.sleep(after)
        pub.send_signal(signal.SIGINT)
        assert wait_exit(pub) == 130
        assert b"Traceback" not in pub.stderr.read()
    finally:
        pub.kill()
        pub.communicate()


def test_resume_from_a_later_file_skips_the_files_before_it(classic_cluster, tmp_path):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_resume_files")
    create_channel(nsqd.http, topic, "all")
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(lines_of("a1", "a2"))
    b.write_bytes(lines_of("b1", "b2", "b3"))
    pub = run_cli(
        "pub", "--nsqd", nsqd.tcp, "--resume-from", f"{b}:1", "--json", topic, str(a), str(b)
    )
    assert pub.returncode == 0, pub.stderr
    assert json.loads(pub.stdout)["published"] == 2
    tail = run_cli("tail", "--nsqd", nsqd.tcp, "--channel", "all", "-n", "2", topic)
    assert tail.stdout.splitlines() == [b"b2", b"b3"]
    bad = run_cli("pub", "--nsqd", nsqd.tcp, "--resume-from", "c.txt:3", topic, str(a))
    assert bad.returncode == 2 and b"'c.txt:3'" in bad.stderr, bad.stderr


def test_a_line_too_large_fails_alone_and_the_lines_of_its_batch_are_published(
    classic_cluster,
):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_toolarge")
    big = b"x" * (2 * 1024 * 1024)  # over nsqd's (and the Producer's) 1 MiB
    result = run_cli(
        "pub", "--nsqd", nsqd.tcp, topic, "--json", input=lines_of("a", "b", big, "c", "d")
    )
    assert result.returncode == 1, result.stderr
    *failures, summary = [json.loads(x) for x in result.stdout.splitlines()]
    assert [f["lines"] for f in failures] == ["3"], failures
    assert "max_message_size" in failures[0]["error"]
    assert summary["published"] == 4 and summary["failed"] == 1, summary
    assert summary["resume_from"] == "2" and summary["published_after_position"] == 2, summary
    assert _count(nsqd.http, topic) == 4
