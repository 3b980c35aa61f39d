"""pytest fixtures with real, throw-away NSQ servers (loaded through the ``pytest11`` entry
point wherever smartnsq is installed; ``-p no:smartnsq`` turns them off).

* ``nsq_cluster`` — an :class:`~smartnsq.testing.NsqCluster`: one nsqlookupd and one nsqd
  registered with it, on free loopback ports, started for the test and stopped after it.
* ``nsqd`` — its nsqd: ``nsqd.tcp`` (``"127.0.0.1:PORT"``), ``nsqd.http``, ``nsqd.https``.
* ``nsqlookupd`` — its nsqlookupd: ``nsqlookupd.http``, ``nsqlookupd.tcp``.
* ``nsqd_args`` / ``nsqlookupd_args`` — extra command-line flags (empty lists); override them
  in a test module or conftest, e.g. ``return ["--max-msg-size=2048"]``.

Nothing starts unless a test asks for one of the server fixtures. The binaries come from
``$SMARTNSQ_NSQ_BIN_DIR`` or ``PATH``; when they are missing, the test fails with one message
that says how to get them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from smartnsq.testing import Daemon, NsqCluster, ServersNotFound, find_servers, start_cluster


@pytest.fixture
def nsqd_args() -> list[str]:
    """Extra flags for the ``nsqd`` of ``nsq_cluster`` (override to change them)."""
    return []


@pytest.fixture
def nsqlookupd_args() -> list[str]:
    """Extra flags for the ``nsqlookupd`` of ``nsq_cluster`` (override to change them)."""
    return []


@pytest.fixture
def nsq_cluster(
    tmp_path_factory: pytest.TempPathFactory, nsqd_args: list[str], nsqlookupd_args: list[str]
) -> Iterator[NsqCluster]:
    """One nsqlookupd and one nsqd registered with it, stopped after the test."""
    try:
        find_servers()
    except ServersNotFound as exc:
        missing = str(exc)  # reported below, outside the except: one message, no traceback
    else:
        missing = ""
    if missing:
        pytest.fail(f"smartnsq.testing: {missing}", pytrace=False)
    cluster = start_cluster(
        tmp_path_factory.mktemp("nsq"), nsqd_args=nsqd_args, lookupd_args=nsqlookupd_args
    )
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def nsqd(nsq_cluster: NsqCluster) -> Daemon:
    """The nsqd of ``nsq_cluster``: ``.tcp`` for producers and consumers, ``.http``."""
    return nsq_cluster.nsqd[0]


@pytest.fixture
def nsqlookupd(nsq_cluster: NsqCluster) -> Daemon:
    """The nsqlookupd of ``nsq_cluster``: ``.http`` for ``lookupd_http_addresses``."""
    return nsq_cluster.lookupd[0]
