"""--tls, --tls-ca and --tls-insecure against an nsqd that requires TLS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from compat.cluster import Cluster
from tests.cli.clihelp import lines_of, run_cli
from tests.helpers import start_tls_cluster, topic_stats, unique

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> Iterator[tuple[Cluster, Path]]:
    """A classic cluster whose nsqd takes TLS only, and the CA file that signed its cert."""
    d: Path = tmp_path_factory.mktemp("cli-tls")
    cluster = start_tls_cluster(trustme.CA(), d)
    try:
        yield cluster, d / "ca.pem"
    finally:
        cluster.stop()


def test_pub_and_tail_over_verified_tls(tls):
    cluster, ca = tls
    nsqd = cluster.nsqd[0]
    topic = unique("cli_tls")
    pub = run_cli("pub", "--nsqd", nsqd.tcp, "--tls-ca", str(ca), topic, input=b"secret\n")
    assert pub.returncode == 0, pub.stderr
    tail = run_cli(
        "tail", "--nsqd", nsqd.tcp, "--tls-ca", str(ca), "--channel", "c", "-n", "1", topic
    )
    assert tail.returncode == 0, tail.stderr
    assert tail.stdout == b"secret\n"


def test_an_unverifiable_certificate_is_refused_unless_insecure(tls):
    cluster, _ = tls
    nsqd = cluster.nsqd[0]
    topic = unique("cli_tls")
    refused = run_cli("pub", "--nsqd", nsqd.tcp, "--tls", topic, input=b"x\n")
    assert refused.returncode == 1
    assert "CERTIFICATE_VERIFY_FAILED" in refused.stderr.decode()
    insecure = run_cli("pub", "--nsqd", nsqd.tcp, "--tls-insecure", topic, input=lines_of("y"))
    assert insecure.returncode == 0, insecure.stderr
    assert (topic_stats(nsqd.http, topic) or {}).get("message_count") == 1
