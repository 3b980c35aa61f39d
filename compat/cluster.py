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
import contextlib
import json
import os
import resource
import shutil
import signal as _signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any

from compat.servers import ensure_binaries

HOST = "127.0.0.1"
ACCEPT_V1 = {"Accept": "application/vnd.nsq; version=1.0"}
STATE_FILE = "cluster.json"
DEFAULT_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0


class ClusterError(RuntimeError):
    """A daemon died or did not become ready in time."""


# --------------------------------------------------------------------------- helpers


_handed_out: set[int] = set()


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1, never one this process handed out before.

    The kernel may offer the same ephemeral port to two consecutive bind(0) calls once the
    first socket is closed, so remembering what we gave away matters (a daemon configured
    with two equal ports dies on start). A tiny race with other processes remains.
    """
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((HOST, 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def http_request(
    url: str, method: str = "GET", data: bytes | None = None, timeout: float = 5.0
) -> tuple[int, bytes]:
    """HTTP request with the nsq v1 Accept header; returns (status, body), even for 4xx/5xx."""
    req = urllib.request.Request(url, data=data, method=method, headers=ACCEPT_V1)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read()


def http_json(url: str, method: str = "GET", timeout: float = 5.0) -> Any:
    """Decoded JSON of a 200 answer (legacy ``data`` envelope unwrapped); raises otherwise."""
    status, body = http_request(url, method=method, timeout=timeout)
    if status != 200:
        raise ClusterError(f"{method} {url} -> HTTP {status}: {body[:500]!r}")
    if not body.strip():
        return None
    obj = json.loads(body)
    if isinstance(obj, dict) and "status_code" in obj and "data" in obj:
        return obj["data"]
    return obj


def _raise_nofile_limit() -> None:
    """Children inherit our soft RLIMIT_NOFILE; raise it to the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie counts as dead
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


# --------------------------------------------------------------------------- daemons


@dataclass
class Daemon:
    """One server process. Addresses are ``host:port`` strings ("" when not applicable)."""

    name: str  # e.g. "nsqd0", "nsqlookupd0", "etcd"
    role: str  # "nsqd" | "nsqlookupd" | "etcd"
    argv: list[str]
    log: str
    data: str = ""
    tcp: str = ""
    http: str = ""
    https: str = ""
    rpc: str = ""
    extra: dict[str, str] = field(default_factory=dict)
    pid: int = 0
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    def spawn(self) -> None:
        if self.data:
            Path(self.data).mkdir(parents=True, exist_ok=True)
        Path(self.log).parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as logf:
            logf.write(f"\n=== {time.strftime('%H:%M:%S')} start: {' '.join(self.argv)}\n".encode())
            logf.flush()
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                cwd=self.data or None,
                start_new_session=True,
            )
        self.pid = self._proc.pid

    def alive(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        return self.pid > 0 and _pid_alive(self.pid)

    def signal(self, sig: int) -> None:
        if self.pid > 0 and self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def wait_exit(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                return True
            time.sleep(0.02)
        return not self.alive()

    def terminate(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds."""
        if not self.alive():
            self._reap()
            return
        self.signal(_signal.SIGTERM)
        if not self.wait_exit(timeout):
            self.signal(_signal.SIGKILL)
            self.wait_exit(5.0)
        self._reap()

    def _reap(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=1.0)

    def log_tail(self, lines: int = 40) -> str:
        """Last lines of the stdout/stderr log (and of the glog INFO file for the fork)."""
        files = [Path(self.log)]
        if self.extra.get("glog"):
            files += sorted(Path(self.extra["glog"]).glob("*.log.INFO.*"))[-1:]
        parts = []
        for f in files:
            try:
                text = f.read_text(errors="replace")
            except OSError:
                continue
            parts.append(f"[{f}]\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(parts) or "(no log)"

    def to_state(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> Daemon:
        return cls(**{k: v for k, v in d.items() if k != "_proc"})


def _wait(what: str, check: Callable[[], bool], daemons: Sequence[Daemon], timeout: float) -> None:
    """Poll ``check`` until true; fail early if a daemon died; include log tails in errors."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    last_exc: Exception | None = None
    while True:
        for d in daemons:
            if not d.alive():
                raise ClusterError(
                    f"{d.name} exited while waiting for {what}; log tail:\n{d.log_tail()}"
                )
        try:
            if check():
                return
            last_exc = None
        except (OSError, ValueError, ClusterError) as e:  # connection refused, bad JSON, ...
            last_exc = e
        if time.monotonic() >= deadline:
            tails = "\n".join(f"--- {d.name} ({d.log}):\n{d.log_tail()}" for d in daemons)
            raise ClusterError(
                f"timed out after {timeout:.0f}s waiting for {what} "
                f"(last error: {last_exc})\n{tails}"
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)


def _ping(http: str) -> bool:
    status, body = http_request(f"http://{http}/ping", timeout=2.0)
    return status == 200 and body.strip() == b"OK"


# --------------------------------------------------------------------------- cluster


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
    ) -> Cluster:
        """Start etcd (youzan), ``lookupd`` nsqlookupd and ``nsqd`` nsqd; wait until ready."""
        if kind not in ("classic", "youzan"):
            raise ValueError(f"unknown kind {kind!r}")
        if dir is None:
            import tempfile

            dir = tempfile.mkdtemp(prefix=f"smartnsq-{kind}-")
        n_nsqd = nsqd if nsqd is not None else (1 if kind == "classic" else 2)
        bins = {k: str(v) for k, v in ensure_binaries(kind).items()}
        _raise_nofile_limit()
        root = Path(dir).resolve()
        root.mkdir(parents=True, exist_ok=True)
        if (root / STATE_FILE).exists():
            raise ClusterError(
                f"{root / STATE_FILE} exists: a cluster may still run there (stop it first)"
            )
        cluster_id = f"smartnsq-{uuid.uuid4().hex[:12]}" if kind == "youzan" else ""
        self = cls(kind, root, cluster_id)
        self.timeout = timeout
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
            name = f"nsqlookupd{i}"
            log, data = self._paths(name)
            tcp, http = f"{HOST}:{free_port()}", f"{HOST}:{free_port()}"
            argv = [
                bins["nsqlookupd"],
                f"--tcp-address={tcp}",
                f"--http-address={http}",
                f"--broadcast-address={HOST}",
                *lookupd_args,
            ]
            self.lookupd.append(Daemon(name, "nsqlookupd", argv, log, data, tcp=tcp, http=http))
        for d in self.lookupd:
            d.spawn()
        self._save()
        for d in self.lookupd:
            _wait(f"{d.name} /ping", partial(_ping, d.http), [d], self.timeout)
        for i in range(n_nsqd):
            name = f"nsqd{i}"
            log, data = self._paths(name)
            tcp, http, https = (f"{HOST}:{free_port()}" for _ in range(3))
            argv = [
                bins["nsqd"],
                f"--tcp-address={tcp}",
                f"--http-address={http}",
                f"--https-address={https}",
                f"--broadcast-address={HOST}",
                f"--data-path={data}",
                *(f"--lookupd-tcp-address={lk.tcp}" for lk in self.lookupd),
                *nsqd_args,
            ]
            self.nsqd.append(Daemon(name, "nsqd", argv, log, data, tcp=tcp, http=http, https=https))
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
        _wait(
            "etcd v2 API",
            lambda: http_request(f"http://{etcd.http}/v2/keys/")[0] == 200,
            [etcd],
            self.timeout,
        )
        etcd_url = f"http://{etcd.http}"
        for i in range(n_lookupd):
            name = f"nsqlookupd{i}"
            log, data = self._paths(name)
            tcp, http = f"{HOST}:{free_port()}", f"{HOST}:{free_port()}"
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
            _wait(f"{d.name} /ping", partial(_ping, d.http), [d, etcd], self.timeout)
        _wait(
            "nsqlookupd leader election",
            lambda: bool(self.lookupd_leader()),
            [*self.lookupd, etcd],
            self.timeout,
        )
        for i in range(n_nsqd):
            name = f"nsqd{i}"
            log, data = self._paths(name)
            tcp, http, https = (f"{HOST}:{free_port()}" for _ in range(3))
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

    def _registered(self, d: Daemon, lookupd_http: str) -> bool:
        nodes = http_json(f"http://{lookupd_http}/nodes", timeout=2.0) or {}
        port = int(d.tcp.rsplit(":", 1)[1])
        return any(int(p.get("tcp_port", 0)) == port for p in nodes.get("producers") or [])

    def _wait_nsqd_ready(self, d: Daemon) -> None:
        others = [x for x in (self.etcd, *self.lookupd) if x is not None]
        _wait(f"{d.name} /ping", lambda: _ping(d.http), [d, *others], self.timeout)
        if self.kind == "classic":
            for lk in self.lookupd:
                _wait(
                    f"{d.name} registered in {lk.name}",
                    partial(self._registered, d, lk.http),
                    [d, lk],
                    self.timeout,
                )
        else:
            _wait(
                f"{d.name} registered in the leader nsqlookupd",
                lambda: self._registered(d, self.lookupd_leader()),
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
        d._reap()

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
            for d in group:
                d.signal(_signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT
            for d in group:
                d.wait_exit(max(0.0, deadline - time.monotonic()))
            for d in group:
                if d.alive():
                    d.signal(_signal.SIGKILL)
                    d.wait_exit(5.0)
                d._reap()
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
