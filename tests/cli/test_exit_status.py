"""Every command's exit status after a signal sent to the real process: 130 after SIGINT, 143
after SIGTERM, and the JSON summary says the same (status 0 and 1 are in the commands' own
tests and test_errors)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cli.clihelp import LineReader, connected_to, lines_of, run_cli, spawn_cli, wait_exit
from tests.helpers import channel_stats, create_channel, settled, topic_stats, unique, wait_for

pytestmark = pytest.mark.integration

Started = tuple[subprocess.Popen[bytes], LineReader | None]


def _published(nsqd: Any, topic: str) -> None:
    assert run_cli("pub", "--nsqd", nsqd.tcp, topic, input=lines_of("one")).returncode == 0


def _tail(nsqd: Any, tmp_path: Path) -> Started:
    topic = unique("st_tail")
    proc = spawn_cli("tail", "--nsqd", nsqd.tcp, "--channel", "c", topic)
    wait_for(lambda: channel_stats(nsqd.http, topic, "c"), what="tail's channel")
    _published(nsqd, topic)
    out = LineReader(proc.stdout)  # type: ignore[arg-type]
    out.wait_for(1)  # running: it printed the message
    return proc, None


def _to_file(nsqd: Any, tmp_path: Path) -> Started:
    topic = unique("st_file")
    create_channel(nsqd.http, topic, "c")
    _published(nsqd, topic)
    args = ["--nsqd", nsqd.tcp, "--channel", "c", "--dir", str(tmp_path), "--json", topic]
    proc = spawn_cli("to-file", *args)
    wait_for(lambda: settled(nsqd.http, topic, "c", 1), what="the line written")
    return proc, LineReader(proc.stdout)  # type: ignore[arg-type]


def _to_nsq(nsqd: Any, tmp_path: Path) -> Started:
    src, dst = unique("st_src"), unique("st_dst")
    create_channel(nsqd.http, src, "c")
    _published(nsqd, src)
    proc = spawn_cli("to-nsq", src, "--nsqd", nsqd.tcp, "--channel", "c", "--to", dst, "--json")
    wait_for(lambda: settled(nsqd.http, src, "c", 1), what="the message copied")
    return proc, LineReader(proc.stdout)  # type: ignore[arg-type]


def _pub(nsqd: Any, tmp_path: Path) -> Started:
    topic = unique("st_pub")
    proc = spawn_cli("pub", "--nsqd", nsqd.tcp, "--json", topic, stdin=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(b"one\n")
    proc.stdin.flush()  # the input stays open: pub waits for more
    wait_for(
        lambda: (topic_stats(nsqd.http, topic) or {}).get("message_count") == 1,
        what="the line published",
    )
    return proc, LineReader(proc.stdout)  # type: ignore[arg-type]


def _stat(nsqd: Any, tmp_path: Path) -> Started:
    args = ["--nsqd-http", nsqd.http, "--watch", "--json", "--interval", "0.2"]
    proc = spawn_cli("stat", *args)
    out = LineReader(proc.stdout)  # type: ignore[arg-type]
    out.wait_for(1)  # running: it showed a report
    return proc, None


COMMANDS: dict[str, Callable[[Any, Path], Started]] = {
    "tail": _tail,
    "to-file": _to_file,
    "to-nsq": _to_nsq,
    "pub": _pub,
    "stat": _stat,
}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_signal_gives_130_or_143_and_the_summary_says_interrupted(
    classic_cluster, tmp_path, command, signum
):
    proc, out = COMMANDS[command](classic_cluster.nsqd[0], tmp_path)
    assert proc.poll() is None, proc.stderr.read()  # type: ignore[union-attr]
    proc.send_signal(signum)
    expected = 128 + signum
    assert wait_exit(proc) == expected, proc.stderr.read()  # type: ignore[union-attr]
    err = proc.stderr.read().decode()  # type: ignore[union-attr]
    assert "Traceback" not in err and "error" not in err, err
    if out is not None:
        summary = json.loads(out.wait_for(1)[-1])
        assert (summary["ok"], summary["status"], summary["exit_status"]) == (
            False,
            "interrupted",
            expected,
        )


@pytest.mark.parametrize("command", ["to-nsq", "to-file"])
def test_a_signal_during_start_up_still_gives_the_json_summary(cluster_factory, tmp_path, command):
    # lookupd does not answer (SIGSTOP): Ctrl-C while the command still looks the topic up.
    cluster = cluster_factory(nsqd=1)
    lookupd = cluster.lookupd[0]
    topic = unique("cli_startsig")
    extra = ["--to", topic + "_copy"] if command == "to-nsq" else ["--dir", str(tmp_path)]
    os.kill(lookupd.pid, signal.SIGSTOP)
    try:
        proc = spawn_cli(command, topic, "--lookupd", lookupd.http, "--json", *extra)
        wait_for(lambda: connected_to(lookupd.http), what="the lookup under way")
        proc.send_signal(signal.SIGINT)
        status = wait_exit(proc, timeout=10)
    finally:
        os.kill(lookupd.pid, signal.SIGCONT)
    out, err = proc.communicate()
    assert status == 130, err
    summary = json.loads(out.splitlines()[-1])
    assert (summary["status"], summary["exit_status"]) == ("interrupted", 130), summary
