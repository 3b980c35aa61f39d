"""Start and stop real NSQ clusters on loopback (classic nsqio/nsq or the Youzan HA fork).

Programmatic use::

    cluster = Cluster.start(kind="classic", dir=tmp, nsqd=1)
    cluster.nsqd[0].tcp        # "127.0.0.1:PORT"
    cluster.stop()

CLI (prints one JSON object on stdout, leaves the daemons running)::

    python -m compat.cluster start --kind classic --dir DIR [--nsqd N] [--lookupd N]
    python -m compat.cluster stop --dir DIR
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal as _signal
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from compat.servers import ensure_binaries
from smartnsq.testing import _process
from smartnsq.testing._process import (
    DEFAULT_TIMEOUT,
    HOST,
    STOP_TIMEOUT,
    free_port,
    http_json,
    http_request,
    nsqd_daemon,
    nsqlookupd_daemon,
    ping,
    raise_nofile_limit,
    registered,
    stop,
    wait_ready,
    wait_until,
)

__all__ = [
    "Cluster",
    "ClusterError",
    "Daemon",
    "free_port",
    "http_json",
    "http_request",
]

STATE_FILE = "cluster.json"

# The process handling (free ports, spawning, readiness polls, SIGTERM then SIGKILL, log tails)
# is smartnsq.testing._process, shared with the pytest plugin that smartnsq ships for its users.
ClusterError = _process.ServerError


@dataclass
class Daemon(_process.Daemon):
    """A server of a cluster; the fork's daemons also have an RPC port and glog files."""

    rpc: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def log_files(self) -> list[Path]:
        files = super().log_files()
        if self.extra.get("glog"):
            files += sorted(Path(self.extra["glog"]).glob("*.log.INFO.*"))[-1:]
        return files

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> Daemon:
        return cls(**{k: v for k, v in d.items() if k != "_proc"})


# --------------------------------------------------------------------------- cluster


def _lists_port(lookupd_http: str, tcp_port: int) -> bool:
    nodes = http_json(f"http://{lookupd_http}/nodes", timeout=2.0) or {}
    return any(int(p.get("tcp_port", 0)) == tcp_port for p in nodes.get("producers") or [])


class Cluster:
    """A running loopback cluster; create with :meth:`Cluster.start`."""

    def __init__(self, kind: str, dir: Path, cluster_id: str = "") -> None:
        self.kind = kind
        self.dir = Path(dir)
        self.cluster_id = cluster_id
        self.etcd: Daemon | None = None
        self.lookupd: list[Daemon] = []
        self.nsqd: list[Daemon] = []
        self.timeout = DEFAULT_TIMEOUT
        self._listen_host = HOST
        self._expose: Callable[[str, str, str], object] | None = None

    # ---- construction

    @classmethod
    def start(
        cls,
        kind: str = "classic",
        dir: Path | str | None = None,
        nsqd: int | None = None,
        lookupd: int = 1,
        nsqd_args: Sequence[str] = (),
        lookupd_args: Sequence[str] = (),
        timeout: float = DEFAULT_TIMEOUT,
        listen_host: str = HOST,
        expose: Callable[[str, str, str], object] | None = None,
    ) -> Cluster:
        """Start etcd (youzan), ``lookupd`` nsqlookupd and ``nsqd`` nsqd; wait until ready.

        youzan only: with ``listen_host`` (another loopback address, say ``127.0.0.2``) the
        nsqlookupd and nsqd listen there, while they still register ``127.0.0.1`` with the
        cluster (``--broadcast-interface=lo``); ``expose(name, public, upstream)`` is called
        for each of their TCP and HTTP ports before they start, to put something (a
        fault-injecting proxy) on ``127.0.0.1:PORT`` that forwards to ``listen_host:PORT``.
        Everything the clients learn from the lookupds then goes through it."""
        if listen_host != HOST and (kind != "youzan" or expose is None):
            raise ValueError("listen_host needs kind='youzan' and an expose callback")
        if kind not in ("classic", "youzan"):
            raise ValueError(f"unknown kind {kind!r}")
        if dir is None:
            import tempfile

            dir = tempfile.mkdtemp(prefix=f"smartnsq-{kind}-")
        n_nsqd = nsqd if nsqd is not None else (1 if kind == "classic" else 2)
        bins = {k: str(v) for k, v in ensure_binaries(kind).items()}
        raise_nofile_limit()
        root = Path(dir).resolve()
        root.mkdir(parents=True, exist_ok=True)
        if (root / STATE_FILE).exists():
            raise ClusterError(
                f"{root / STATE_FILE} exists: a cluster may still run there (stop it first)"
            )
        cluster_id = f"smartnsq-{uuid.uuid4().hex[:12]}" if kind == "youzan" else ""
        self = cls(kind, root, cluster_id)
        self.timeout = timeout
        self._listen_host = listen_host
        self._expose = expose
        try:
            if kind == "classic":
                self._start_classic(bins, n_nsqd, lookupd, list(nsqd_args), list(lookupd_args))
            else:
                self._start_youzan(bins, n_nsqd, lookupd, list(nsqd_args), list(lookupd_args))
        except BaseException:
            self.stop()
            raise
        return self

    def _paths(self, name: str) -> tuple[str, str]:
        return str(self.dir / "logs" / f"{name}.log"), str(self.dir / "data" / name)

    def _glog_dir(self, name: str) -> str:
        path = self.dir / "logs" / name
        path.mkdir(parents=True, exist_ok=True)
        return str(path)

    def _start_classic(
        self,
        bins: dict[str, str],
        n_nsqd: int,
        n_lookupd: int,
        nsqd_args: list[str],
        lookupd_args: list[str],
    ) -> None:
        for i in range(n_lookupd):
            log, data = self._paths(f"nsqlookupd{i}")
            lk = nsqlookupd_daemon(bins["nsqlookupd"], f"nsqlookupd{i}", log, data, lookupd_args)
            self.lookupd.append(Daemon.from_state(lk.to_state()))
        for d in self.lookupd:
            d.spawn()
        self._save()
        for d in self.lookupd:
            wait_ready(d, timeout=self.timeout)
        lookupd_tcp = [lk.tcp for lk in self.lookupd]
        for i in range(n_nsqd):
            log, data = self._paths(f"nsqd{i}")
            nd = nsqd_daemon(bins["nsqd"], f"nsqd{i}", log, data, lookupd_tcp, nsqd_args)
            self.nsqd.append(Daemon.from_state(nd.to_state()))
        for d in self.nsqd:
            d.spawn()
        self._save()
        for d in self.nsqd:
            self._wait_nsqd_ready(d)

    def _start_youzan(
        self,
        bins: dict[str, str],
        n_nsqd: int,
        n_lookupd: int,
        nsqd_args: list[str],
        lookupd_args: list[str],
    ) -> None:
        # etcd (v2) -> nsqlookupd -> leader elected -> nsqd (HA nsqd panics without lookupd in 30 s)
        log, data = self._paths("etcd")
        client, peer = f"{HOST}:{free_port()}", f"{HOST}:{free_port()}"
        argv = [
            bins["etcd"],
            "--name=smartnsq-etcd",
            f"--data-dir={data}",
            f"--listen-client-urls=http://{client}",
            f"--advertise-client-urls=http://{client}",
            f"--listen-peer-urls=http://{peer}",
            f"--initial-advertise-peer-urls=http://{peer}",
            f"--initial-cluster=smartnsq-etcd=http://{peer}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token={self.cluster_id}",
            "--enable-v2=true",
            "--heartbeat-interval=20",
            "--election-timeout=200",
            "--log-level=warn",
        ]
        self.etcd = Daemon("etcd", "etcd", argv, log, data, http=client, extra={"peer": peer})
        self.etcd.spawn()
        self._save()
        etcd = self.etcd
        wait_until(
            "etcd v2 API",
            lambda: http_request(f"http://{etcd.http}/v2/keys/")[0] == 200,
            [etcd],
            self.timeout,
        )
        etcd_url = f"http://{etcd.http}"
        for i in range(n_lookupd):
            name = f"nsqlookupd{i}"
            log, data = self._paths(name)
            tcp, http = self._listen(f"{name}-tcp"), self._listen(f"{name}-http")
            rpc, metric = str(free_port()), f"{HOST}:{free_port()}"
            glog = self._glog_dir(name)
            argv = [
                bins["nsqlookupd"],
                f"--tcp-address={tcp}",
                f"--http-address={http}",
                f"--rpc-port={rpc}",
                "--broadcast-interface=lo",
                f"--cluster-id={self.cluster_id}",
                f"--cluster-leadership-addresses={etcd_url}",
                f"--metric-address={metric}",
                f"--log-dir={glog}",
                *lookupd_args,
            ]
            self.lookupd.append(
                Daemon(
                    name,
                    "nsqlookupd",
                    argv,
                    log,
                    data,
                    tcp=tcp,
                    http=http,
                    rpc=rpc,
                    extra={"metric": metric, "glog": glog},
                )
            )
        for d in self.lookupd:
            d.spawn()
        self._save()
        for d in self.lookupd:
            wait_until(f"{d.name} /ping", partial(ping, d.http), [d, etcd], self.timeout)
        wait_until(
            "nsqlookupd leader election",
            lambda: bool(self.lookupd_leader()),
            [*self.lookupd, etcd],
            self.timeout,
        )
        for i in range(n_nsqd):
            name = f"nsqd{i}"
            log, data = self._paths(name)
            tcp, http = self._listen(f"{name}-tcp"), self._listen(f"{name}-http")
            https = f"{self._listen_host}:{free_port()}"
            rpc, metric = str(free_port()), f"{HOST}:{free_port()}"
            glog = self._glog_dir(name)
            argv = [
                bins["nsqd"],
                f"--tcp-address={tcp}",
                f"--http-address={http}",
                f"--https-address={https}",
                f"--rpc-port={rpc}",
                "--broadcast-interface=lo",
                f"--data-path={data}",
                f"--worker-id={i + 1}",
                f"--cluster-id={self.cluster_id}",
                f"--cluster-leadership-addresses={etcd_url}",
                f"--metric-address={metric}",
                f"--log-dir={glog}",
                *nsqd_args,
            ]
            self.nsqd.append(
                Daemon(
                    name,
                    "nsqd",
                    argv,
                    log,
                    data,
                    tcp=tcp,
                    http=http,
                    https=https,
                    rpc=rpc,
                    extra={"metric": metric, "glog": glog},
                )
            )
        for d in self.nsqd:
            d.spawn()
        self._save()
        for d in self.nsqd:
            self._wait_nsqd_ready(d)

    def add_nsqd(
        self,
        args: Sequence[str] = (),
        advertise: Callable[[Daemon], tuple[str, str]] | None = None,
    ) -> Daemon:
        """Start one more classic nsqd (registering with every lookupd); wait until ready.

        ``advertise`` is called with the new daemon (ports chosen, not yet started) and
        returns the TCP and HTTP ``host:port`` it should register with the lookupds instead
        of its own (a proxy in front of it, say)."""
        if self.kind != "classic":
            raise ClusterError("add_nsqd starts classic nsqd only")
        bins = {k: str(v) for k, v in ensure_binaries("classic").items()}
        name = f"nsqd{len(self.nsqd)}"
        log, data = self._paths(name)
        lookupd_tcp = [lk.tcp for lk in self.lookupd]
        d = Daemon.from_state(
            nsqd_daemon(bins["nsqd"], name, log, data, lookupd_tcp, list(args)).to_state()
        )
        if advertise is not None:
            tcp, http = advertise(d)
            d.argv += [
                f"--broadcast-address={tcp.rsplit(':', 1)[0]}",
                f"--broadcast-tcp-port={tcp.rsplit(':', 1)[1]}",
                f"--broadcast-http-port={http.rsplit(':', 1)[1]}",
            ]
            d.extra["broadcast_tcp"] = tcp
        self.nsqd.append(d)
        d.spawn()
        self._save()
        self._wait_nsqd_ready(d)
        return d

    def _listen(self, name: str) -> str:
        """A free port on the listen host; exposed on 127.0.0.1 when that is another host."""
        port = free_port()
        address = f"{self._listen_host}:{port}"
        if self._listen_host != HOST and self._expose is not None:
            self._expose(name, f"{HOST}:{port}", address)
        return address

    # ---- readiness

    def lookupd_leader(self) -> str:
        """HTTP ``host:port`` of the leader nsqlookupd (youzan); the first lookupd for classic."""
        if self.kind == "classic":
            return self.lookupd[0].http
        for d in self.lookupd:
            try:
                info = http_json(f"http://{d.http}/listlookup", timeout=2.0) or {}
            except (OSError, ValueError, ClusterError):
                continue
            leader = info.get("lookupdleader") or {}
            if leader.get("ID"):
                return f"{leader['NodeIP']}:{leader['HttpPort']}"
        return ""

    def _wait_nsqd_ready(self, d: Daemon) -> None:
        if self.kind == "classic" and d.extra.get("broadcast_tcp"):
            # registered under the address it advertises, not its own port
            port = int(d.extra["broadcast_tcp"].rsplit(":", 1)[1])
            wait_until(f"{d.name} /ping", partial(ping, d.http), [d], self.timeout)
            for lk in self.lookupd:
                wait_until(
                    f"{d.name} registered in {lk.name}",
                    partial(_lists_port, lk.http, port),
                    [d, *self.lookupd],
                    self.timeout,
                )
            return
        if self.kind == "classic":
            wait_ready(d, self.lookupd, timeout=self.timeout)
            return
        others = [x for x in (self.etcd, *self.lookupd) if x is not None]
        wait_until(f"{d.name} /ping", lambda: ping(d.http), [d, *others], self.timeout)
        wait_until(
            f"{d.name} registered in the leader nsqlookupd",
            lambda: registered(d, self.lookupd_leader()),
            [d, *others],
            self.timeout,
        )

    # ---- info / state

    @property
    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "kind": self.kind,
            "dir": str(self.dir),
            "nsqd_tcp": [d.tcp for d in self.nsqd],
            "nsqd_http": [d.http for d in self.nsqd],
            "nsqd_https": [d.https for d in self.nsqd],
            "lookupd_tcp": [d.tcp for d in self.lookupd],
            "lookupd_http": [d.http for d in self.lookupd],
        }
        if self.kind == "youzan":
            info["etcd"] = [self.etcd.http] if self.etcd else []
            info["cluster_id"] = self.cluster_id
        return info

    def _daemons(self) -> list[Daemon]:
        return [*self.nsqd, *self.lookupd, *([self.etcd] if self.etcd else [])]

    def _save(self) -> None:
        state = {
            "kind": self.kind,
            "cluster_id": self.cluster_id,
            "info": self.info,
            "etcd": self.etcd.to_state() if self.etcd else None,
            "lookupd": [d.to_state() for d in self.lookupd],
            "nsqd": [d.to_state() for d in self.nsqd],
        }
        tmp = self.dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.dir / STATE_FILE)

    @classmethod
    def load(cls, dir: Path | str) -> Cluster:
        """Re-attach to a cluster started elsewhere (e.g. by the CLI) from ``DIR/cluster.json``."""
        root = Path(dir).resolve()
        state = json.loads((root / STATE_FILE).read_text())
        self = cls(state["kind"], root, state.get("cluster_id", ""))
        self.etcd = Daemon.from_state(state["etcd"]) if state.get("etcd") else None
        self.lookupd = [Daemon.from_state(d) for d in state["lookupd"]]
        self.nsqd = [Daemon.from_state(d) for d in state["nsqd"]]
        return self

    # ---- fault injection

    def kill_nsqd(
        self, i: int, signal: int = _signal.SIGKILL, timeout: float = STOP_TIMEOUT
    ) -> None:
        """Send ``signal`` to nsqd ``i`` and wait until it has exited."""
        d = self.nsqd[i]
        d.signal(signal)
        if not d.wait_exit(timeout):
            raise ClusterError(f"{d.name} did not exit within {timeout}s after signal {signal}")
        d.reap()

    def restart_nsqd(self, i: int) -> None:
        """(Re)start nsqd ``i`` with the same ports and data dir; wait until ready."""
        d = self.nsqd[i]
        if d.alive():
            d.terminate()
        d.spawn()
        self._save()
        self._wait_nsqd_ready(d)

    # ---- teardown

    def stop(self, remove_data: bool = True) -> None:
        """Stop every daemon (SIGTERM, SIGKILL after a deadline); remove data dirs and state."""
        groups = [self.nsqd, self.lookupd, [self.etcd] if self.etcd else []]
        for group in groups:
            stop(group, STOP_TIMEOUT)
        if remove_data:
            shutil.rmtree(self.dir / "data", ignore_errors=True)
        (self.dir / STATE_FILE).unlink(missing_ok=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m compat.cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_start = sub.add_parser(
        "start", help="start a cluster in the background and print its addresses as JSON"
    )
    p_start.add_argument("--kind", choices=("classic", "youzan"), default="classic")
    p_start.add_argument("--dir", required=True, type=Path)
    p_start.add_argument(
        "--nsqd", type=int, default=None, help="number of nsqd (default 1 classic, 2 youzan)"
    )
    p_start.add_argument("--lookupd", type=int, default=1)
    p_start.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT)
    p_start.add_argument(
        "--nsqd-arg", action="append", default=[], help="extra nsqd flag (repeatable)"
    )
    p_start.add_argument(
        "--lookupd-arg", action="append", default=[], help="extra nsqlookupd flag (repeatable)"
    )
    p_stop = sub.add_parser("stop", help="stop the cluster recorded in DIR and remove its data")
    p_stop.add_argument("--dir", required=True, type=Path)
    p_build = sub.add_parser("build", help="only build/cache the server binaries")
    p_build.add_argument("--kind", choices=("classic", "youzan"), action="append")
    args = parser.parse_args(argv)

    if args.cmd == "start":
        cluster = Cluster.start(
            kind=args.kind,
            dir=args.dir,
            nsqd=args.nsqd,
            lookupd=args.lookupd,
            nsqd_args=args.nsqd_arg,
            lookupd_args=args.lookupd_arg,
            timeout=args.timeout,
        )
        # detach: the daemons keep running after we exit (own sessions, output in log files)
        print(json.dumps(cluster.info), flush=True)
        return 0
    if args.cmd == "stop":
        if not (args.dir / STATE_FILE).exists():
            print(f"no {STATE_FILE} in {args.dir}: nothing to stop", file=sys.stderr)
            return 0
        Cluster.load(args.dir).stop()
        return 0
    for kind in args.kind or ["classic", "youzan"]:
        ensure_binaries(kind)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
