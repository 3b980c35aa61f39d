"""pytest fixtures that run real NSQ clusters on loopback.

Enable with ``pytest_plugins = ["compat.pytest_plugin"]`` in the root ``conftest.py``.
Fixtures fail (never skip) when the servers cannot be built or started.

* ``classic_cluster`` — module-scoped classic cluster (1 nsqlookupd, 1 nsqd).
* ``youzan_cluster`` — module-scoped Youzan HA cluster (etcd, 1 nsqlookupd, 2 nsqd).
  The one exception to "never skip": when the Youzan *binaries cannot be obtained at all*
  (the Go module proxy refuses the fork's module and no prebuilt copy is configured or
  cached), its tests are skipped with that reason spelled out, unless
  ``SMARTNSQ_REQUIRE_YOUZAN=1`` is set, which turns the skip into a failure. A cluster that
  cannot *start* always fails.
* ``cluster_factory`` — function-scoped factory
  ``cluster_factory(kind="classic", nsqd=None, lookupd=1, nsqd_args=(), lookupd_args=())``;
  every cluster it started is stopped at teardown.
* ``toxiproxy`` — function-scoped :class:`compat.toxiproxy.Toxiproxy` on loopback (built
  from its Go module on first use), stopped at teardown.
* ``proxied_classic`` — function-scoped factory ``proxied_classic(nsqd=2, lookupd=1,
  nsqd_args=())`` of classic clusters whose nsqd and lookupd ports are behind the
  ``toxiproxy`` fixture's proxies (:func:`compat.toxiproxy.start_proxied_classic`).
* ``proxied_youzan`` — the same for Youzan HA clusters, ``proxied_youzan(nsqd=3,
  lookupd=2)`` (:func:`compat.toxiproxy.start_proxied_youzan`); skips like
  ``youzan_cluster`` when the fork's binaries cannot be had.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Protocol

import pytest

from compat.cluster import Cluster
from compat.servers import BuildError, ensure_binaries
from compat.toxiproxy import (
    ProxiedClassic,
    ProxiedYouzan,
    Toxiproxy,
    start_proxied_classic,
    start_proxied_youzan,
)


class ClusterFactory(Protocol):
    def __call__(
        self,
        kind: str = "classic",
        nsqd: int | None = None,
        lookupd: int = 1,
        nsqd_args: Sequence[str] = (),
        lookupd_args: Sequence[str] = (),
    ) -> Cluster: ...


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "integration: needs real NSQ server processes (compat/)")
    config.addinivalue_line("markers", "faults: network faults injected with Toxiproxy (compat/)")
    config.addinivalue_line("markers", "slow: a long case (minutes); `./dev test` runs it too")


def _start(tmp_path_factory: pytest.TempPathFactory, kind: str, **kwargs: object) -> Cluster:
    return Cluster.start(kind=kind, dir=tmp_path_factory.mktemp(f"nsq-{kind}"), **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def classic_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = _start(tmp_path_factory, "classic", nsqd=1)
    try:
        yield cluster
    finally:
        cluster.stop()


def require_youzan_binaries() -> None:
    try:
        ensure_binaries("youzan")
    except BuildError as exc:
        if os.environ.get("SMARTNSQ_REQUIRE_YOUZAN") == "1":
            raise
        pytest.skip(f"Youzan HA servers unavailable on this machine: {exc}")


@pytest.fixture(scope="module")
def youzan_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    require_youzan_binaries()
    cluster = _start(tmp_path_factory, "youzan", nsqd=2)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFactory]:
    started: list[Cluster] = []

    def factory(
        kind: str = "classic",
        nsqd: int | None = None,
        lookupd: int = 1,
        nsqd_args: Sequence[str] = (),
        lookupd_args: Sequence[str] = (),
    ) -> Cluster:
        if kind == "youzan":
            require_youzan_binaries()
        cluster = _start(
            tmp_path_factory,
            kind,
            nsqd=nsqd,
            lookupd=lookupd,
            nsqd_args=nsqd_args,
            lookupd_args=lookupd_args,
        )
        started.append(cluster)
        return cluster

    try:
        yield factory
    finally:
        for cluster in reversed(started):
            cluster.stop()


@pytest.fixture
def toxiproxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Toxiproxy]:
    server = Toxiproxy.start(tmp_path_factory.mktemp("toxiproxy"))
    try:
        yield server
    finally:
        server.stop()


class ProxiedFactory(Protocol):
    def __call__(
        self, nsqd: int = 2, lookupd: int = 1, nsqd_args: Sequence[str] = ()
    ) -> ProxiedClassic: ...


@pytest.fixture
def proxied_classic(
    toxiproxy: Toxiproxy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxiedFactory]:
    started: list[ProxiedClassic] = []

    def factory(nsqd: int = 2, lookupd: int = 1, nsqd_args: Sequence[str] = ()) -> ProxiedClassic:
        dir = tmp_path_factory.mktemp("nsq-proxied")
        started.append(start_proxied_classic(toxiproxy, dir, nsqd, lookupd, nsqd_args))
        return started[-1]

    try:
        yield factory
    finally:
        for cluster in reversed(started):
            cluster.stop()


class ProxiedYouzanFactory(Protocol):
    def __call__(
        self, nsqd: int = 3, lookupd: int = 2, nsqd_args: Sequence[str] = ()
    ) -> ProxiedYouzan: ...


@pytest.fixture
def proxied_youzan(
    toxiproxy: Toxiproxy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxiedYouzanFactory]:
    started: list[ProxiedYouzan] = []

    def factory(nsqd: int = 3, lookupd: int = 2, nsqd_args: Sequence[str] = ()) -> ProxiedYouzan:
        require_youzan_binaries()
        dir = tmp_path_factory.mktemp("nsq-proxied-youzan")
        started.append(start_proxied_youzan(toxiproxy, dir, nsqd, lookupd, nsqd_args))
        return started[-1]

    try:
        yield factory
    finally:
        for cluster in reversed(started):
            cluster.stop()
