"""to-file against a real classic nsqd: rotation, SIGTERM, every message exactly once."""

from __future__ import annotations

import gzip
import json
import signal
import zlib
from collections import Counter
from pathlib import Path

import pytest

from tests.cli.clihelp import lines_of, run_cli, spawn_cli, wait_exit
from tests.helpers import channel_stats, unique, wait_for

pytestmark = pytest.mark.integration

CHANNEL = "archive"


def _read(path: Path) -> list[bytes]:
    """The complete lines of a file, a gzip file possibly still being written included."""
    data = path.read_bytes()
    if path.suffix == ".gz":
        # Up to the last sync point: a file still open has no gzip trailer yet.
        data = zlib.decompressobj(wbits=31).decompress(data)
    return data.split(b"\n")[:-1]


def _lines(directory: Path) -> list[bytes]:
    return [line for f in sorted(directory.iterdir()) for line in _read(f)]


def _publish(nsqd_tcp: str, topic: str, bodies: list[str]) -> None:
    pub = run_cli("pub", "--nsqd", nsqd_tcp, topic, input=lines_of(*bodies))
    assert pub.returncode == 0, pub.stderr


def _settled(nsqd_http: str, topic: str) -> dict[str, int] | None:
    """The channel's depth and in-flight count once nothing is in flight."""
    c = channel_stats(nsqd_http, topic, CHANNEL)
    if c is None or c["in_flight_count"]:
        return None
    return {"depth": c["depth"], "in_flight": c["in_flight_count"]}


def test_sigterm_mid_stream_and_rotation_keep_every_message_exactly_once(classic_cluster, tmp_path):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_file")
    bodies = [f"message-{i:05d}" for i in range(3000)]
    _publish(nsqd.tcp, topic, bodies)
    out = tmp_path / "out"
    args = ["to-file", "--nsqd", nsqd.tcp, "--channel", CHANNEL, "--dir", str(out)]
    args += ["--rotate-size", "8K", "--max-in-flight", "20", topic]

    first = spawn_cli(*args)
    # Stop it while it is busy: some lines written, many messages still to come.
    wait_for(lambda: out.exists() and len(_lines(out)) >= 300, what="300 lines on disk")
    first.send_signal(signal.SIGTERM)
    assert wait_exit(first) == 143, first.stderr.read()  # type: ignore[union-attr]
    written = _lines(out)
    assert len(written) < len(bodies), "stopped too late to test a stop mid-stream"
    assert len(set(written)) == len(written)
    # What was not written went back to nsqd: nothing in flight, the rest still queued.
    settled = wait_for(lambda: _settled(nsqd.http, topic), what="no message in flight")
    assert settled["depth"] == len(bodies) - len(written)

    second = spawn_cli(*args, "--json")
    wait_for(lambda: len(_lines(out)) >= len(bodies), timeout=60, what="every line on disk")
    wait_for(lambda: (_settled(nsqd.http, topic) or {}).get("depth") == 0, what="all FINed")
    second.send_signal(signal.SIGTERM)
    assert wait_exit(second) == 143, second.stderr.read()  # type: ignore[union-attr]
    summary = json.loads(second.stdout.read())  # type: ignore[union-attr]
    assert summary["written"] == len(bodies) - len(written)

    counts = Counter(line.decode() for line in _lines(out))
    assert counts == Counter(bodies)  # every message, each once
    files = sorted(out.iterdir())
    assert len(files) >= 4  # 8 KiB per file: rotated several times
    assert all(f.name.startswith(f"{topic}.") and f.name.endswith(".log") for f in files)
    assert all(f.stat().st_size <= 8192 + 32 for f in files)


def test_gzip_files_hold_every_message_after_sigterm(classic_cluster, tmp_path):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_gz")
    bodies = [f"gz-{i}" for i in range(500)]
    _publish(nsqd.tcp, topic, bodies)
    out = tmp_path / "gz"
    proc = spawn_cli(
        "to-file", "--nsqd", nsqd.tcp, "--channel", CHANNEL, "--dir", str(out), "--gzip",
        "--pattern", "{topic}-%Y%m%d.txt", topic,
    )  # fmt: skip
    wait_for(lambda: (_settled(nsqd.http, topic) or {}).get("depth") == 0, what="all FINed")
    # FINed means fsynced: the lines are readable before the file is closed.
    assert len(_lines(out)) == len(bodies)
    proc.send_signal(signal.SIGTERM)
    assert wait_exit(proc) == 143, proc.stderr.read()  # type: ignore[union-attr]
    (path,) = out.iterdir()
    assert path.name.startswith(f"{topic}-") and path.name.endswith(".txt.gz")
    # Closed properly: a complete gzip file with its trailer.
    assert gzip.decompress(path.read_bytes()).decode().splitlines() == bodies
