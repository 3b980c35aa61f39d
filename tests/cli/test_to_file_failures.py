"""to-file when the disk fails it, and when a second signal comes during its stop: a one-line
reason and a non-zero status, files that hold whole lines only (valid gzip), nothing lost."""

from __future__ import annotations

import gzip
import json
import os
import resource
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.clihelp import lines_of, run_cli, spawn_cli, wait_exit
from tests.helpers import channel_stats, create_channel, unique, wait_for

pytestmark = pytest.mark.integration

CHANNEL = "archive"


def _limit_file_size(limit: int) -> Callable[[], None]:
    """A full disk for one process: writes past ``limit`` bytes fail with EFBIG."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def _whole_lines(path: Path) -> list[bytes]:
    """The lines of a finished file, which must end with a whole line (a complete gzip)."""
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)  # raises on a torn file (no trailer)
    assert data.endswith(b"\n"), data[-40:]
    return data.split(b"\n")[:-1]


def _left(nsqd_http: str, topic: str) -> int | None:
    """The messages back in the channel once none is in flight."""
    c = channel_stats(nsqd_http, topic, CHANNEL)
    if c is None or c["in_flight_count"]:
        return None
    return int(c["depth"] + c["deferred_count"])


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_a_full_disk_stops_with_one_line_and_keeps_whole_lines(classic_cluster, tmp_path, compress):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_full")
    bodies = [f"message-{i:05d}-{os.urandom(8).hex()}" for i in range(3000)]  # ~110 KB
    create_channel(nsqd.http, topic, CHANNEL)
    assert run_cli("pub", "--nsqd", nsqd.tcp, topic, input=lines_of(*bodies)).returncode == 0
    out = tmp_path / "out"
    args = ["to-file", "--nsqd", nsqd.tcp, "--channel", CHANNEL, "--dir", str(out), "--json"]
    proc = spawn_cli(*args, *(["--gzip"] if compress else []), topic,
                     preexec_fn=_limit_file_size(20_000))  # fmt: skip
    status = wait_exit(proc, timeout=30)  # it stops by itself
    result_err = proc.stderr.read().decode()  # type: ignore[union-attr]
    assert status == 1, result_err
    assert result_err.count("\n") == 1 and "Traceback" not in result_err, result_err
    assert "File too large" in result_err and str(out) in result_err
    summary = json.loads(proc.stdout.read())  # type: ignore[union-attr]
    assert (summary["ok"], summary["status"], summary["exit_status"]) == (False, "failed", 1)

    written = [line for f in sorted(out.iterdir()) for line in _whole_lines(f)]
    assert 0 < len(written) < len(bodies)
    assert len(set(written)) == len(written) and set(written) <= {b.encode() for b in bodies}
    assert summary["written"] == len(written)
    # Every message not in a file is back in nsqd.
    assert wait_for(lambda: _left(nsqd.http, topic) is not None and _left(nsqd.http, topic),
                    what="nothing in flight") == len(bodies) - len(written)  # fmt: skip


def test_an_output_directory_gone_stops_with_one_line(classic_cluster, tmp_path):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_gone")
    create_channel(nsqd.http, topic, CHANNEL)
    out = tmp_path / "out"
    args = ["to-file", "--nsqd", nsqd.tcp, "--channel", CHANNEL, "--dir", str(out)]
    proc = spawn_cli(*args, "--rotate-size", "1K", topic)
    first = [f"first-{i:04d}" for i in range(50)]
    assert run_cli("pub", "--nsqd", nsqd.tcp, topic, input=lines_of(*first)).returncode == 0
    wait_for(lambda: _left(nsqd.http, topic) == 0 and out.exists(), what="the first written")
    # The directory is replaced by a file: nothing can be created in it any more (root
    # ignores permission bits, so this is how a test makes it unwritable).
    moved = tmp_path / "moved"
    out.rename(moved)
    out.write_bytes(b"")
    later = [f"later-{i:04d}" for i in range(300)]  # 3.3 KB: past the next rotation
    assert run_cli("pub", "--nsqd", nsqd.tcp, topic, input=lines_of(*later)).returncode == 0
    status = wait_exit(proc, timeout=30)
    err = proc.stderr.read().decode()  # type: ignore[union-attr]
    assert status == 1, err
    assert err.count("\n") == 1 and "Not a directory" in err, err
    written = [line for f in sorted(moved.iterdir()) for line in _whole_lines(f)]
    assert written[: len(first)] == [b.encode() for b in first]
    assert wait_for(lambda: _left(nsqd.http, topic) is not None and _left(nsqd.http, topic),
                    what="nothing in flight") == len(first) + len(later) - len(written)  # fmt: skip


def test_a_second_signal_during_a_stalled_stop_leaves_a_valid_gzip(cluster_factory, tmp_path):
    cluster = cluster_factory(nsqd=1)
    nsqd = cluster.nsqd[0]
    topic = unique("cli_stall")
    create_channel(nsqd.http, topic, CHANNEL)
    bodies = [f"stall-{i:04d}" for i in range(200)]
    assert run_cli("pub", "--nsqd", nsqd.tcp, topic, input=lines_of(*bodies)).returncode == 0
    work, out = tmp_path / "work", tmp_path / "out"
    proc = spawn_cli(
        "to-file", "--nsqd", nsqd.tcp, "--channel", CHANNEL, "--work-dir", str(work),
        "--dir", str(out), "--gzip", topic,
    )  # fmt: skip
    wait_for(lambda: _left(nsqd.http, topic) == 0, what="every message written")
    os.kill(nsqd.pid, signal.SIGSTOP)  # nsqd stops answering: the graceful stop stalls
    try:
        proc.send_signal(signal.SIGTERM)
        with pytest.raises(Exception, match="timed out"):
            proc.wait(1.5)  # still stopping
        proc.send_signal(signal.SIGTERM)
        second = time.monotonic()
        assert wait_exit(proc, timeout=10) == 143
        assert time.monotonic() - second < 1.0
    finally:
        os.kill(nsqd.pid, signal.SIGCONT)
    assert list(work.iterdir()) == []  # nothing torn left behind
    (path,) = out.iterdir()
    assert [line.decode() for line in _whole_lines(path)] == bodies
