"""Throw-away NSQ servers for tests of code that uses smartnsq.

With smartnsq installed, pytest has the fixtures of :mod:`smartnsq.testing.plugin`:
``nsqd``, ``nsqlookupd`` and ``nsq_cluster`` (one nsqlookupd and one nsqd registered with it,
on free loopback ports, stopped after the test)::

    async def test_publish(nsqd):
        async with Producer(nsqd_tcp_addresses=[nsqd.tcp]) as producer:
            await producer.publish("events", b"hello")

The servers are the real ``nsqd`` and ``nsqlookupd`` binaries, taken from the folder named by
``SMARTNSQ_NSQ_BIN_DIR`` or else from ``PATH``. :func:`start_cluster` starts the same outside
the fixtures (say, for a session-scoped fixture of your own).

This package imports only the standard library; nothing starts until asked.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from smartnsq.testing._process import (
    DEFAULT_TIMEOUT,
    STOP_TIMEOUT,
    Daemon,
    ServerError,
    nsqd_daemon,
    nsqlookupd_daemon,
    raise_nofile_limit,
    stop,
    wait_ready,
)

__all__ = [
    "BIN_DIR_ENV",
    "Daemon",
    "NsqCluster",
    "ServerError",
    "ServersNotFound",
    "find_servers",
    "start_cluster",
]

BIN_DIR_ENV = "SMARTNSQ_NSQ_BIN_DIR"
SERVERS = ("nsqd", "nsqlookupd")

HOW_TO_GET = f"""\
Put the NSQ server binaries (nsqd and nsqlookupd, NSQ 1.x) on PATH, or name the folder that
holds them in the environment variable {BIN_DIR_ENV}. To get them:
  * download a release from https://github.com/nsqio/nsq/releases (for example
    nsq-1.3.0.linux-amd64.go1.21.5.tar.gz) and use its bin/ folder: {BIN_DIR_ENV}=.../bin
  * or build them with Go: git clone --branch v1.3.0 https://github.com/nsqio/nsq &&
    cd nsq && go build -o bin/ ./apps/nsqd ./apps/nsqlookupd  (then {BIN_DIR_ENV}=.../nsq/bin)
  * or a package manager: brew install nsq (macOS), or your distribution's nsq package"""


class ServersNotFound(ServerError):
    """The nsqd / nsqlookupd binaries are not where :func:`find_servers` looks."""


def find_servers(names: Sequence[str] = SERVERS) -> dict[str, str]:
    """``{name: path}`` of the NSQ server binaries, from ``$SMARTNSQ_NSQ_BIN_DIR`` or ``PATH``.

    Raises :class:`ServersNotFound`, saying where it looked and how to get them, when one is
    missing.
    """
    bin_dir = os.environ.get(BIN_DIR_ENV)
    found: dict[str, str] = {}
    for name in names:
        if bin_dir:
            path = Path(bin_dir, name)
            if path.is_file() and os.access(path, os.X_OK):
                found[name] = str(path)
        else:
            which = shutil.which(name)
            if which:
                found[name] = which
    missing = [n for n in names if n not in found]
    if missing:
        where = f"in {BIN_DIR_ENV}={bin_dir}" if bin_dir else f"on PATH ({BIN_DIR_ENV} is not set)"
        raise ServersNotFound(f"{' and '.join(missing)} not found {where}.\n{HOW_TO_GET}")
    return found


class NsqCluster:
    """Running NSQ servers: ``lookupd`` (nsqlookupd) and ``nsqd`` (registered with them).

    Addresses are ``"127.0.0.1:PORT"`` strings: ``cluster.nsqd[0].tcp`` for producers and
    consumers, ``cluster.lookupd[0].http`` for lookupd discovery; logs in ``daemon.log``.
    """

    def __init__(self, dir: Path, lookupd: list[Daemon], nsqd: list[Daemon]) -> None:
        self.dir = dir
        self.lookupd = lookupd
        self.nsqd = nsqd

    @property
    def nsqd_tcp_addresses(self) -> list[str]:
        return [d.tcp for d in self.nsqd]

    @property
    def lookupd_http_addresses(self) -> list[str]:
        return [d.http for d in self.lookupd]

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop every server (nsqd first): SIGTERM, then SIGKILL after ``timeout`` seconds."""
        stop(self.nsqd, timeout)
        stop(self.lookupd, timeout)

    def __enter__(self) -> NsqCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"NsqCluster(nsqd={self.nsqd_tcp_addresses}, lookupd={self.lookupd_http_addresses})"


def start_cluster(
    dir: Path | str,
    *,
    nsqd: int = 1,
    lookupd: int = 1,
    nsqd_args: Sequence[str] = (),
    lookupd_args: Sequence[str] = (),
    timeout: float = DEFAULT_TIMEOUT,
) -> NsqCluster:
    """Start ``lookupd`` nsqlookupd and ``nsqd`` nsqd on free loopback ports; wait until ready.

    Logs go to ``dir/logs/``, data to ``dir/data/``. Every nsqd registers with every
    nsqlookupd, and the call returns once each lookupd lists each nsqd. A server that exits
    or is not ready within ``timeout`` seconds raises :class:`ServerError` with the tail of its
    log (and what was started is stopped). Use as ``with start_cluster(dir) as cluster:`` or
    call :meth:`NsqCluster.stop`.
    """
    bins = find_servers()
    root = Path(dir)
    raise_nofile_limit()

    def paths(name: str) -> tuple[str, str]:
        return str(root / "logs" / f"{name}.log"), str(root / "data" / name)

    cluster = NsqCluster(root, [], [])
    try:
        for i in range(lookupd):
            log, data = paths(f"nsqlookupd{i}")
            d = nsqlookupd_daemon(bins["nsqlookupd"], f"nsqlookupd{i}", log, data, lookupd_args)
            cluster.lookupd.append(d)
            d.spawn()
        for d in cluster.lookupd:
            wait_ready(d, timeout=timeout)
        lookupd_tcp = [d.tcp for d in cluster.lookupd]
        for i in range(nsqd):
            log, data = paths(f"nsqd{i}")
            d = nsqd_daemon(bins["nsqd"], f"nsqd{i}", log, data, lookupd_tcp, nsqd_args)
            cluster.nsqd.append(d)
            d.spawn()
        for d in cluster.nsqd:
            wait_ready(d, cluster.lookupd, timeout=timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster
