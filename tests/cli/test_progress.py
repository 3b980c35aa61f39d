"""pub's progress bar: on a terminal (a pseudo-terminal here), and not otherwise."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest

from tests.cli.clihelp import CLI, cli_env, run_cli
from tests.helpers import topic_stats, unique

pytestmark = pytest.mark.integration

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def _read_all(fd: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> bytes:
    """Everything written to the terminal until the process exits."""
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the other end is closed and nothing is left
            break
        if not chunk:
            break
        out += chunk
    proc.wait(max(0.0, deadline - time.monotonic()))
    return out


def test_progress_bar_shows_count_rate_and_eta_on_a_terminal(classic_cluster, tmp_path):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_tty")
    data = tmp_path / "lines.txt"
    data.write_bytes(b"".join(b"line %d\n" % i for i in range(20000)))
    master, slave = os.openpty()
    env = cli_env(COLUMNS="120", TERM="xterm")
    proc = subprocess.Popen(
        [*CLI, "pub", "--nsqd", nsqd.tcp, topic, str(data)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        env=env,
    )
    os.close(slave)  # the child holds its own copy: reading ends when it exits
    try:
        screen = ANSI.sub(b"", _read_all(master, proc)).decode()
    finally:
        os.close(master)
    assert proc.returncode == 0, screen
    assert proc.stdout is not None
    with proc.stdout:
        assert proc.stdout.read() == b""
    assert (topic_stats(nsqd.http, topic) or {}).get("message_count") == 20000
    # The bar's last state: the count, a rate, 100 % and the ETA column; then the summary.
    assert re.search(r"20000 published +\d+ msg/s .*100% ETA", screen), screen
    assert f"published 20000 messages to {topic}" in screen


def test_no_progress_output_when_stderr_is_not_a_terminal(classic_cluster, tmp_path):
    nsqd = classic_cluster.nsqd[0]
    data = tmp_path / "lines.txt"
    data.write_bytes(b"".join(b"line %d\n" % i for i in range(2000)))
    pub = run_cli("pub", "--nsqd", nsqd.tcp, unique("cli_notty"), str(data))
    assert pub.returncode == 0
    assert pub.stderr == b"" and pub.stdout == b""
