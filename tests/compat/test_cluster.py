"""Integration tests of the compat/ harness itself (real servers on loopback)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from compat.cluster import Cluster, http_json, http_request
from compat.pytest_plugin import ClusterFactory
from compat.youzan import create_topic, lookup

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _topic_stats(nsqd_http: str, topic: str) -> list[dict[str, Any]]:
    stats = http_json(f"http://{nsqd_http}/stats?format=json&topic={topic}")
    return [t for t in stats["topics"] if t["topic_name"] == topic]


def _pub(
    nsqd_http: str, topic: str, body: bytes, partition: int | None = None
) -> tuple[int, bytes]:
    q = {"topic": topic} if partition is None else {"topic": topic, "partition": str(partition)}
    return http_request(f"http://{nsqd_http}/pub?{urllib.parse.urlencode(q)}", "POST", body)


def test_classic_publish_and_stats(classic_cluster: Cluster) -> None:
    assert _pub(classic_cluster.nsqd[0].http, "t", b"hello") == (200, b"OK")
    (topic,) = _topic_stats(classic_cluster.nsqd[0].http, "t")
    assert topic["message_count"] == 1
    nodes = http_json(f"http://{classic_cluster.lookupd[0].http}/nodes")
    assert len(nodes["producers"]) == 1


def test_classic_kill_and_restart(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory("classic", nsqd=3, lookupd=2)
    assert len(cluster.info["nsqd_tcp"]) == 3 and len(cluster.info["lookupd_http"]) == 2
    http = cluster.nsqd[1].http
    assert _pub(http, "durable", b"x" * 10)[0] == 200
    # a SIGTERM-ed nsqd persists its in-memory queue; the restarted one keeps its data dir
    cluster.kill_nsqd(1, signal.SIGTERM)
    assert not cluster.nsqd[1].alive()
    cluster.restart_nsqd(1)
    assert cluster.nsqd[1].http == http
    (topic,) = _topic_stats(http, "durable")
    assert topic["depth"] == 1
    cluster.kill_nsqd(0)  # SIGKILL
    cluster.restart_nsqd(0)
    assert _pub(cluster.nsqd[0].http, "t", b"again")[0] == 200


def test_cli_start_stop(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "compat.cluster"]
    out = subprocess.run(
        [*cmd, "start", "--kind", "classic", "--dir", str(tmp_path)],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    info = json.loads(out)
    try:
        assert http_request(f"http://{info['nsqd_http'][0]}/ping")[0] == 200
        assert (tmp_path / "cluster.json").is_file()
    finally:
        subprocess.run([*cmd, "stop", "--dir", str(tmp_path)], cwd=REPO, check=True, timeout=60)
    assert not (tmp_path / "cluster.json").exists()
    with pytest.raises(OSError):
        http_request(f"http://{info['nsqd_http'][0]}/ping", timeout=1.0)


def test_youzan_partitioned_topic(youzan_cluster: Cluster) -> None:
    info = youzan_cluster.info
    assert len(info["nsqd_tcp"]) == 2 and info["etcd"]
    w = create_topic(youzan_cluster, "yz_t", partitions=2, replicas=1, channel="ch")
    assert set(w["partitions"]) == {"0", "1"}
    assert w["meta"]["partition_num"] == 2
    for p in ("0", "1"):
        node = w["partitions"][p]
        http = f"{node['broadcast_address']}:{node['http_port']}"
        status, body = _pub(http, "yz_t", b"msg-" + p.encode(), partition=int(p))
        assert status == 200, body
    total = sum(
        int(t["message_count"]) for d in youzan_cluster.nsqd for t in _topic_stats(d.http, "yz_t")
    )
    assert total == 2
    assert set(lookup(youzan_cluster.lookupd[0].http, "yz_t", "r")["partitions"]) == {"0", "1"}
