"""Running the ``smartnsq`` command line as a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import IO, Any

CLI = [sys.executable, "-m", "smartnsq"]


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of the test process without NSQ_* settings that could leak in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSQ_")}
    env.update(extra)
    return env


def run_cli(
    *args: str,
    input: bytes | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*CLI, *args],
        input=input,
        capture_output=True,
        env=env or cli_env(),
        timeout=timeout,
        check=False,
    )


SPAWNED: list[subprocess.Popen[bytes]] = []  # killed and closed after each test (conftest)


def spawn_cli(
    *args: str, stdin: Any = subprocess.DEVNULL, **kwargs: Any
) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [*CLI, *args],
        stdin=stdin,
        stdout=kwargs.pop("stdout", subprocess.PIPE),
        stderr=kwargs.pop("stderr", subprocess.PIPE),
        env=kwargs.pop("env", None) or cli_env(),
        **kwargs,
    )
    SPAWNED.append(proc)
    return proc


def cleanup_spawned() -> None:
    """Kill what a test left running and close the pipes to every process it started."""
    while SPAWNED:
        proc = SPAWNED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


class LineReader:
    """Collects the lines of a pipe in a thread, so a test can wait for them with a deadline."""

    def __init__(self, pipe: IO[bytes]) -> None:
        self.lines: list[bytes] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: IO[bytes]) -> None:
        for line in pipe:
            with self._cond:
                self.lines.append(line.rstrip(b"\n"))
                self._cond.notify_all()

    def wait_for(self, count: int, timeout: float = 30.0) -> list[bytes]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.lines) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"got {len(self.lines)} lines of {count} within {timeout}s: "
                        f"{self.lines[-5:]!r}"
                    )
                self._cond.wait(left)
            return list(self.lines)


def one_line_error(result: subprocess.CompletedProcess[bytes], *needles: str) -> str:
    """Assert a failed run said exactly one line on stderr, naming ``needles``; return it."""
    err = result.stderr.decode()
    assert result.returncode != 0, (result.returncode, err)
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)
    return err.strip()


def addresses(cluster: Any, lookupd: bool = True, nsqd: bool = False) -> list[str]:
    args: list[str] = []
    if lookupd:
        for d in cluster.lookupd:
            args += ["--lookupd", d.http]
    if nsqd:
        for d in cluster.nsqd:
            args += ["--nsqd", d.tcp]
    return args


def connected_to(address: str) -> bool:
    """Some process holds an open TCP connection to ``address`` (HOST:PORT; Linux's
    /proc/net/tcp): a server stopped with SIGSTOP still accepts connections."""
    port = f"{int(address.rpartition(':')[2]):04X}"
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return any(row[2].endswith(":" + port) and row[3] == "01" for row in rows)


def lines_of(*items: str | bytes) -> bytes:
    return b"".join((i.encode() if isinstance(i, str) else i) + b"\n" for i in items)


def wait_exit(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


__all__ = [
    "CLI",
    "LineReader",
    "addresses",
    "cli_env",
    "connected_to",
    "lines_of",
    "one_line_error",
    "run_cli",
    "cleanup_spawned",
    "spawn_cli",
    "wait_exit",
]
