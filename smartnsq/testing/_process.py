"""Server processes for tests: start a daemon on free loopback ports, wait until it is ready,
stop it (SIGTERM, then SIGKILL), read its log.

Shared by the pytest plugin (:mod:`smartnsq.testing`) and the project's own test clusters
(``compat/``). Only the standard library: importing this starts nothing and costs little.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal as _signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
ACCEPT_V1 = {"Accept": "application/vnd.nsq; version=1.0"}
DEFAULT_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0


class ServerError(RuntimeError):
    """A server process died or did not become ready in time."""


_handed_out: set[int] = set()


def ephemeral_ports() -> tuple[int, int]:
    """The range the kernel picks a client socket's local port from (Linux's setting, else
    the IANA range other systems use)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49152, 65535


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1, never one this process handed out before.

    It is taken from just below the ephemeral range: a port from ``bind(0)`` is free only
    until the daemon binds it, and meanwhile any process's outgoing connection (a test's
    client, in this very process) may be given it; CI saw nsqd die of "address already in
    use" that way. Below the range only another explicit bind can take it.
    """
    low = ephemeral_ports()[0]
    for _ in range(1000):
        port = random.randrange(max(1024, low - 12000), low)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue  # in use (or a TIME_WAIT the daemon might not reuse)
        _handed_out.add(port)
        return port
    while True:  # that whole stretch taken: fall back to the kernel's choice
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((HOST, 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def free_address() -> str:
    """``127.0.0.1:PORT`` with a port from :func:`free_port`."""
    return f"{HOST}:{free_port()}"


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
        raise ServerError(f"{method} {url} -> HTTP {status}: {body[:500]!r}")
    if not body.strip():
        return None
    obj = json.loads(body)
    if isinstance(obj, dict) and "status_code" in obj and "data" in obj:
        return obj["data"]
    return obj


def ping(http: str) -> bool:
    """True when ``GET http://HTTP/ping`` answers ``OK`` (nsqd and nsqlookupd)."""
    status, body = http_request(f"http://{http}/ping", timeout=2.0)
    return status == 200 and body.strip() == b"OK"


def raise_nofile_limit() -> None:
    """Children inherit our soft RLIMIT_NOFILE; raise it to the hard limit (POSIX)."""
    try:
        import resource
    except ImportError:  # not POSIX: the pytest plugin still loads
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


@dataclass
class Daemon:
    """One server process. Addresses are ``host:port`` strings ("" when not applicable).

    ``log`` is the file that gets the process's stdout and stderr; ``data`` its working
    (and data) directory.
    """

    name: str  # e.g. "nsqd0", "nsqlookupd0"
    role: str  # "nsqd" | "nsqlookupd" | ...
    argv: list[str]
    log: str
    data: str = ""
    tcp: str = ""
    http: str = ""
    https: str = ""
    pid: int = 0
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    def spawn(self) -> None:
        """Start the process in its own session, output appended to :attr:`log`."""
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
        return self.pid > 0 and pid_alive(self.pid)

    def signal(self, sig: int) -> None:
        if self.pid > 0 and self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def wait_exit(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the process to exit; True if it has."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                return True
            time.sleep(0.02)
        return not self.alive()

    def terminate(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds."""
        stop([self], timeout)

    def reap(self) -> None:
        """Collect the exit status of a process this object started (no zombie is left)."""
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=1.0)

    def log_files(self) -> list[Path]:
        """Files worth showing when the process fails: its stdout/stderr log."""
        return [Path(self.log)]

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of each of :meth:`log_files`."""
        parts = []
        for f in self.log_files():
            try:
                text = f.read_text(errors="replace")
            except OSError:
                continue
            parts.append(f"[{f}]\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(parts) or "(no log)"

    def to_state(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}


def stop(daemons: Sequence[Daemon], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM to every one of ``daemons`` at once; SIGKILL to those alive after ``timeout``."""
    for d in daemons:
        d.signal(_signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for d in daemons:
        d.wait_exit(max(0.0, deadline - time.monotonic()))
    for d in daemons:
        if d.alive():
            d.signal(getattr(_signal, "SIGKILL", _signal.SIGTERM))
            d.wait_exit(5.0)
        d.reap()


def wait_until(
    what: str, check: Callable[[], bool], daemons: Sequence[Daemon], timeout: float
) -> None:
    """Poll ``check`` until true; fail early if a daemon died; include log tails in errors."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    last_exc: Exception | None = None
    while True:
        for d in daemons:
            if not d.alive():
                raise ServerError(
                    f"{d.name} exited while waiting for {what}; log tail:\n{d.log_tail()}"
                )
        try:
            if check():
                return
            last_exc = None
        except (OSError, ValueError, ServerError) as e:  # connection refused, bad JSON, ...
            last_exc = e
        if time.monotonic() >= deadline:
            tails = "\n".join(f"--- {d.name} ({d.log}):\n{d.log_tail()}" for d in daemons)
            raise ServerError(
                f"timed out after {timeout:.0f}s waiting for {what} "
                f"(last error: {last_exc})\n{tails}"
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)


def registered(nsqd: Daemon, lookupd_http: str) -> bool:
    """Whether the lookupd at ``lookupd_http`` lists ``nsqd`` in ``/nodes``."""
    nodes = http_json(f"http://{lookupd_http}/nodes", timeout=2.0) or {}
    port = int(nsqd.tcp.rsplit(":", 1)[1])
    return any(int(p.get("tcp_port", 0)) == port for p in nodes.get("producers") or [])


# --------------------------------------------------------------------------- classic NSQ


def nsqlookupd_daemon(
    binary: str, name: str, log: str, data: str, args: Sequence[str] = ()
) -> Daemon:
    """A classic nsqlookupd on free loopback ports (not started yet)."""
    tcp, http = free_address(), free_address()
    argv = [
        binary,
        f"--tcp-address={tcp}",
        f"--http-address={http}",
        f"--broadcast-address={HOST}",
        *args,
    ]
    return Daemon(name, "nsqlookupd", argv, log, data, tcp=tcp, http=http)


def nsqd_daemon(
    binary: str,
    name: str,
    log: str,
    data: str,
    lookupd_tcp: Sequence[str] = (),
    args: Sequence[str] = (),
) -> Daemon:
    """A classic nsqd on free loopback ports (TCP, HTTP and HTTPS), registering with the
    nsqlookupd at ``lookupd_tcp`` (not started yet)."""
    tcp, http, https = free_address(), free_address(), free_address()
    argv = [
        binary,
        f"--tcp-address={tcp}",
        f"--http-address={http}",
        f"--https-address={https}",
        f"--broadcast-address={HOST}",
        f"--data-path={data}",
        *(f"--lookupd-tcp-address={a}" for a in lookupd_tcp),
        *args,
    ]
    return Daemon(name, "nsqd", argv, log, data, tcp=tcp, http=http, https=https)


def wait_ready(
    d: Daemon,
    lookupds: Sequence[Daemon] = (),
    watch: Sequence[Daemon] = (),
    timeout: float = DEFAULT_TIMEOUT,
) -> None:
    """Wait until ``d`` answers ``/ping`` and, for an nsqd, every one of ``lookupds`` lists it.

    Fails at once when ``d``, one of ``lookupds`` or of ``watch`` exits.
    """
    others = [*lookupds, *watch]
    wait_until(f"{d.name} /ping", lambda: ping(d.http), [d, *others], timeout)
    if d.role == "nsqd":
        for lk in lookupds:
            wait_until(
                f"{d.name} registered in {lk.name}",
                partial(registered, d, lk.http),
                [d, *others],
                timeout,
            )
