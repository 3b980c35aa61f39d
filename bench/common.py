"""Shared helpers for the benchmarks: client registry and virtualenvs, nsqd
start/stop and HTTP helpers, measured subprocess runs, machine facts and
small statistics.  Stdlib only, so the runner stays lean."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import queue
import re
import shlex
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
DRIVERS = BENCH_DIR / "drivers"
VENVS = BENCH_DIR / ".venvs"
RESULTS = BENCH_DIR / "results"
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
NSQD_VERSION = "v1.3.0"  # classic nsqd as built by compat.servers


# ---------------------------------------------------------------- clients
@dataclass(frozen=True)
class Client:
    """A Python NSQ client: its driver script and its pinned virtualenv.

    ``pins`` is the full pip freeze of the client's venv (versions from the
    peer benchmark); an empty tuple means "the smartnsq working tree", run
    with the benchmark's own interpreter and the repository on PYTHONPATH.
    """

    name: str
    driver: str
    pins: tuple[str, ...]
    workloads: frozenset[str]
    label: str = ""
    variant: str = ""  # passed to the driver as --variant

    @property
    def venv(self) -> Path:
        return VENVS / self.name


SEQ = frozenset({"pub", "mpub"})
CLIENTS: dict[str, Client] = {
    c.name: c
    for c in [
        Client("smartnsq", "drv_smartnsq.py", (), SEQ | {"concurrent"}, "smartnsq (asyncio)"),
        Client(
            "smartnsq-uvloop",
            "drv_smartnsq.py",
            (),
            SEQ | {"concurrent"},
            "smartnsq (uvloop)",
            "uvloop",
        ),
        Client(
            "smartnsq-sync",
            "drv_smartnsq.py",
            (),
            SEQ,
            "smartnsq.sync (blocking)",
            "blocking",
        ),
        Client(
            "pynsq",
            "drv_pynsq.py",
            ("pynsq==0.9.1", "tornado==6.6.1"),
            SEQ | {"concurrent"},
            "pynsq 0.9.1 (tornado)",
        ),
        Client(
            "gnsq",
            "drv_gnsq.py",
            (
                "gnsq==1.0.2",
                "gevent==26.9.0",
                "greenlet==3.5.6",
                "blinker==1.9.0",
                "six==1.17.0",
                "urllib3==2.8.0",
                "zope.event==6.2",
                "zope.interface==8.7",
            ),
            SEQ,
            "gnsq 1.0.2 (gevent)",
        ),
        Client(
            "nsq-py",
            "drv_nsqpy.py",
            (
                "nsq-py==0.1.12",
                "certifi==2026.10.18",
                "charset-normalizer==3.5.2",
                "decorator==5.3.1",
                "idna==3.20",
                "requests==2.34.2",
                "six==1.17.0",
                "statsd==4.0.1",
                "urllib3==2.8.0",
            ),
            SEQ,
            "nsq-py 0.1.12 (sync sockets)",
        ),
        Client(
            "ansq",
            "drv_ansq.py",
            (
                "ansq==0.3.0",
                "aiohappyeyeballs==2.7.1",
                "aiohttp==3.14.5",
                "aiosignal==1.4.0",
                "attrs==26.1.0",
                "frozenlist==1.8.0",
                "idna==3.20",
                "multidict==7.2.1",
                "propcache==0.5.4",
                "typing_extensions==4.16.0",
                "yarl==1.25.1",
            ),
            SEQ,
            "ansq 0.3.0 (asyncio)",
        ),
        Client(
            "asyncnsq",
            "drv_asyncnsq.py",
            (
                "asyncnsq==1.2.1",
                "aiohappyeyeballs==2.7.1",
                "aiohttp==3.14.5",
                "aiosignal==1.4.0",
                "attrs==26.1.0",
                "cramjam==2.14.0",
                "frozenlist==1.8.0",
                "idna==3.20",
                "multidict==7.2.1",
                "propcache==0.5.4",
                "python-snappy==0.7.3",
                "typing_extensions==4.16.0",
                "yarl==1.25.1",
            ),
            SEQ,
            "asyncnsq 1.2.1 (asyncio)",
        ),
    ]
}
PEERS = [name for name in CLIENTS if not name.startswith("smartnsq")]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ensure_venv(client: Client, python: str = "python3") -> None:
    """Create the client's venv under bench/.venvs/ and install its pins
    (skipped when the installed pins already match)."""
    if not client.pins:
        return
    marker = client.venv / "bench-pins.txt"
    want = "\n".join(client.pins) + "\n"
    if marker.exists() and marker.read_text() == want:
        return
    log(f"setting up venv {client.venv} ...")
    if client.venv.exists():
        shutil.rmtree(client.venv)
    subprocess.run([python, "-m", "venv", str(client.venv)], check=True)
    subprocess.run(
        [
            str(client.venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            *client.pins,
        ],
        check=True,
    )
    marker.write_text(want)


def client_command(client: Client) -> tuple[list[str], dict[str, str]]:
    """Interpreter + driver path and the environment for one client."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if client.pins:
        python = str(client.venv / "bin" / "python")
    else:
        python = sys.executable
        env["PYTHONPATH"] = str(ROOT)
    return [python, str(DRIVERS / client.driver)], env


def python_version(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() or "?"


# ---------------------------------------------------------------- nsqd
@dataclass
class Nsqd:
    tcp: str
    http: str
    bins: dict[str, Path]
    pid: int | None = None

    def _req(self, method: str, path: str, data: bytes | None = None) -> bytes:
        req = urllib.request.Request(f"http://{self.http}{path}", data=data, method=method)
        with urllib.request.urlopen(req, timeout=30) as r:
            return bytes(r.read())

    def create_topic(self, topic: str) -> None:
        self._req("POST", "/topic/create?topic=" + urllib.parse.quote(topic))

    def delete_topic(self, topic: str) -> None:
        with suppress(OSError):
            self._req("POST", "/topic/delete?topic=" + urllib.parse.quote(topic))

    def topic_stats(self, topic: str) -> dict[str, Any] | None:
        q = urllib.parse.urlencode({"format": "json", "topic": topic, "include_clients": "false"})
        data = json.loads(self._req("GET", "/stats?" + q))
        for t in data.get("topics") or []:
            if t["topic_name"] == topic:
                return dict(t)
        return None

    def create_channel(self, topic: str, channel: str) -> None:
        q = urllib.parse.urlencode({"topic": topic, "channel": channel})
        self._req("POST", "/channel/create?" + q)

    def mpub_binary(self, topic: str, body: bytes, count: int) -> None:
        """HTTP /mpub in binary mode: ``count`` copies of ``body`` in one request."""
        frame = struct.pack(">I", len(body)) + body
        data = struct.pack(">I", count) + frame * count
        q = urllib.parse.urlencode({"topic": topic, "binary": "true"})
        self._req("POST", "/mpub?" + q, data=data)

    def channel_stats(
        self, topic: str, channel: str, clients: bool = False
    ) -> dict[str, Any] | None:
        q = urllib.parse.urlencode(
            {
                "format": "json",
                "topic": topic,
                "channel": channel,
                "include_clients": "true" if clients else "false",
            }
        )
        data = json.loads(self._req("GET", "/stats?" + q))
        for t in data.get("topics") or []:
            if t["topic_name"] == topic:
                for ch in t.get("channels") or []:
                    if ch["channel_name"] == channel:
                        return dict(ch)
        return None

    def message_count(self, topic: str) -> int:
        t = self.topic_stats(topic)
        return int(t["message_count"]) if t else 0

    def version(self) -> str:
        out = subprocess.run([str(self.bins["nsqd"]), "--version"], capture_output=True, text=True)
        return (out.stdout or out.stderr).strip()


NSQD_ARGS = ["--mem-queue-size=10000000"]  # keep every message in memory


def runner_arguments(ap: argparse.ArgumentParser, rounds: int, quick_help: str) -> None:
    """The options every runner has: --rounds, --quick and --md/--no-md."""
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument(
        "--md",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="rewrite BENCHMARKS.md (default: yes, except with --quick)",
    )


def parse_runner_arguments(ap: argparse.ArgumentParser, argv: list[str] | None) -> Any:
    """Parse; --quick means one round unless --rounds is given."""
    a = ap.parse_args(argv)
    if a.quick and "--rounds" not in (sys.argv[1:] if argv is None else argv):
        a.rounds = 1
    return a


@contextmanager
def benchmark_nsqd(
    data: dict[str, Any], out: Path, extra_args: list[str] | None = None
) -> Iterator[Nsqd]:
    """The runner's nsqd (in a temporary directory), noted in the results."""
    with (
        tempfile.TemporaryDirectory(prefix="bench-nsqd-") as workdir,
        nsqd_server(Path(workdir), extra_args) as nsqd,
    ):
        data["nsqd_version"] = nsqd.version()
        log(f"{data['nsqd_version']} on {nsqd.tcp}; results -> {rel(out)}")
        yield nsqd


@contextmanager
def nsqd_server(workdir: Path, extra_args: list[str] | None = None) -> Iterator[Nsqd]:
    """One classic nsqd (no nsqlookupd) on 127.0.0.1 for the whole invocation,
    started through ``compat.cluster`` from ``compat.servers`` binaries."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from compat.cluster import Cluster
    from compat.servers import ensure_binaries

    bins = dict(ensure_binaries("classic"))
    cluster = Cluster.start(
        kind="classic", dir=workdir, nsqd=1, lookupd=0, nsqd_args=[*NSQD_ARGS, *(extra_args or [])]
    )
    try:
        d = cluster.nsqd[0]
        yield Nsqd(tcp=d.tcp, http=d.http, bins=bins, pid=d.pid)
    finally:
        cluster.stop()


# ---------------------------------------------------------------- measured runs
@dataclass
class ProcResult:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    max_rss_kb: int
    cpu_s: float
    timed_out: bool = False
    rss_upper_bound: bool = False


TIME_V = "/usr/bin/time"  # GNU time: forks the client from a ~2 MB process


def _parse_time_v(text: str) -> tuple[int, float]:
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    user = re.search(r"User time \(seconds\): ([\d.]+)", text)
    syst = re.search(r"System time \(seconds\): ([\d.]+)", text)
    cpu = (float(user.group(1)) if user else 0.0) + (float(syst.group(1)) if syst else 0.0)
    return (int(rss.group(1)) if rss else 0), cpu


def run_measured(
    cmd: list[str],
    env: dict[str, str] | None = None,
    timeout: float = 300.0,
    stdin: int | IO[bytes] = subprocess.DEVNULL,
) -> ProcResult:
    """Run ``cmd`` to completion and measure its peak RSS and CPU time.

    ru_maxrss survives execve(), so a child forked straight from this runner
    would report at least the runner's own RSS.  The client is therefore
    started through GNU ``time -v``, whose small process is what the client
    is forked from.  Without GNU time, wait4() figures are used and are an
    upper bound (``rss_upper_bound``)."""
    use_time = os.access(TIME_V, os.X_OK)
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.NamedTemporaryFile("r") as tv,
    ):
        full = [TIME_V, "-v", "-o", tv.name, *cmd] if use_time else cmd
        t0 = time.monotonic()
        proc = subprocess.Popen(
            full, stdout=out, stderr=err, stdin=stdin, env=env, start_new_session=True
        )
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            _, status, ru = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - t0
        rss, cpu = ru.ru_maxrss, ru.ru_utime + ru.ru_stime
        if use_time:
            rss, cpu = _parse_time_v(tv.read())
        out.seek(0)
        err.seek(0)
        return ProcResult(
            proc.returncode,
            out.read().decode(errors="replace"),
            err.read().decode(errors="replace"),
            wall,
            rss,
            cpu,
            timed_out.is_set(),
            rss_upper_bound=not use_time,
        )


class MeasuredProcess:
    """A client process run like :func:`run_measured` (through GNU ``time -v``,
    in its own session) but interactive: its stdout lines can be read while it
    runs, a line can be written to its stdin, and a signal sent to the client
    itself (not to ``time``, whose report would be lost).  :meth:`finish` waits
    for it and returns the measures."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self.use_time = os.access(TIME_V, os.X_OK)
        # closed by finish()
        self._tv = tempfile.NamedTemporaryFile("r")  # noqa: SIM115
        self._err = tempfile.TemporaryFile()  # noqa: SIM115
        full = [TIME_V, "-v", "-o", self._tv.name, *cmd] if self.use_time else cmd
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            full,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            env=env,
            start_new_session=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._out: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace")
            self._out.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def readline(self, timeout: float) -> str | None:
        """Next stdout line; None at end of output or after ``timeout`` seconds."""
        try:
            return self._lines.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None

    def write_line(self, text: str) -> None:
        with suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.write(text.encode() + b"\n")
            self.proc.stdin.flush()

    def signal(self, sig: int) -> None:
        """Signal the whole process group (``time`` included)."""
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def signal_client(self, sig: int) -> None:
        """Signal the client only: ``time``'s child when run through it.  (Use
        SIGTERM: SIGINT stays ignored in clients started from a background job.)"""
        pid = self.proc.pid
        if self.use_time:
            try:
                kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                kids = []
            if not kids:
                return  # already gone
            pid = int(kids[0])
        with suppress(ProcessLookupError):
            os.kill(pid, sig)

    def finish(self, timeout: float = 15.0) -> ProcResult:
        """Wait for the process (SIGKILL after ``timeout``) and collect its measures."""
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            self.signal(signal.SIGKILL)

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            _, status, ru = os.wait4(self.proc.pid, 0)
        finally:
            timer.cancel()
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - self.t0
        self._reader.join(5)
        if self.proc.stdin is not None:
            with suppress(OSError):
                self.proc.stdin.close()
        rss, cpu = ru.ru_maxrss, ru.ru_utime + ru.ru_stime
        if self.use_time:
            rss, cpu = _parse_time_v(self._tv.read())
        self._err.seek(0)
        err = self._err.read().decode(errors="replace")
        self._tv.close()
        self._err.close()
        return ProcResult(
            self.proc.returncode,
            "".join(self._out),
            err,
            wall,
            rss,
            cpu,
            timed_out.is_set(),
            rss_upper_bound=not self.use_time,
        )


def parse_result_line(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]))
    return None


def measures(pr: ProcResult) -> dict[str, Any]:
    """Peak RSS and CPU/wall seconds of a finished client process, for a run record."""
    return {
        "max_rss_kb": pr.max_rss_kb,
        "cpu_s": round(pr.cpu_s, 3),
        "wall_s": round(pr.wall_s, 3),
        "rss_upper_bound": pr.rss_upper_bound,
    }


def driver_result(rec: dict[str, Any], pr: ProcResult) -> dict[str, Any] | None:
    """Record a driver's measures and its RESULT line; None (and the failure) if it has none."""
    rec.update(measures(pr))
    res = parse_result_line(pr.stdout)
    if res is None:
        why = "timed out" if pr.timed_out else f"exit {pr.returncode}, no RESULT line"
        rec.update(ok=False, error=why, stderr_tail=pr.stderr[-1500:])
        return None
    rec.update(
        n=res["n"],
        rate=res["rate"],
        elapsed=res["elapsed"],
        warmup=res["warmup"],
        workload_cpu_s=round(res.get("cpu", 0.0), 3),
    )
    return res


def finish_record(rec: dict[str, Any], err: str | None, n: int, stderr: str) -> dict[str, Any]:
    """Mark a client run ok (no error and some messages) or failed, keep its stderr tail."""
    rec["ok"] = not err and n > 0
    if err:
        rec["error"] = err
    if stderr.strip():
        rec["stderr_tail"] = stderr[-600:]
    return rec


def rel(p: str | Path) -> str:
    """``p`` relative to the repository root when it is inside it (for printed commands)."""
    try:
        return str(Path(p).absolute().relative_to(ROOT))
    except ValueError:
        return str(p)


def new_results(
    benchmark: str, args: list[str], quick: bool, rounds: int, params: dict[str, Any]
) -> tuple[str, Path, dict[str, Any]]:
    """A time stamp, the results file and its data for one invocation of ``bench.<name>``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    data: dict[str, Any] = {
        "benchmark": benchmark,
        "command": shlex.join([rel(sys.executable), "-m", f"bench.{benchmark}", *args]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "quick": quick,
        "rounds": rounds,
        "params": params,
        "machine": machine_facts(),
        "git": git_describe(),
    }
    return stamp, RESULTS / f"{benchmark}-{stamp}.json", data


def save_run(data: dict[str, Any], out: Path, rec: dict[str, Any], label: str) -> None:
    """Append a run record, rewrite the results file, and log one line about it."""
    data["runs"].append(rec)
    out.write_text(json.dumps(data, indent=1) + "\n")
    rate = rec.get("rate")
    log(
        f"{label} {fmt_rate(rate) if rate else '-':>8s} msg/s  "
        f"rss {fmt_mb(rec.get('max_rss_kb', 0)):>8s}  "
        f"other load {rec.get('other_cpu_frac', -1):.2f}  "
        + ("ok" if rec.get("ok") else f"FAILED: {rec.get('error')}")
    )


GO_RATE = re.compile(r"duration: (\S+) - [\d.]+mb/s - ([\d.]+)ops/s")


# ---------------------------------------------------------------- facts & stats
def machine_facts() -> dict[str, Any]:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "memory": mem,
        "kernel": platform.release(),
        "os": _os_name(),
    }


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return platform.system()


@dataclass
class CpuSnap:
    """System-wide busy CPU (user+nice+system), nsqd's and this runner's CPU."""

    t: float
    busy: float
    nsqd: float
    runner: float


_CLK = os.sysconf("SC_CLK_TCK")


def cpu_snapshot(nsqd_pid: int | None) -> CpuSnap:
    try:
        v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:4]]
        busy = sum(v) / _CLK
    except (OSError, ValueError):
        busy = 0.0
    nsqd = 0.0
    if nsqd_pid:
        try:
            st = Path(f"/proc/{nsqd_pid}/stat").read_text().rsplit(")", 1)[1].split()
            nsqd = (int(st[11]) + int(st[12])) / _CLK
        except (OSError, ValueError, IndexError):
            pass
    t = os.times()
    return CpuSnap(time.monotonic(), busy, nsqd, t.user + t.system)


def cpu_delta(a: CpuSnap, b: CpuSnap, client_cpu: float) -> dict[str, float]:
    """nsqd CPU seconds and the share of the machine used by everything else
    (other jobs) while a client ran, as a fraction of all cores."""
    wall = b.t - a.t
    if wall <= 0:
        return {}
    nsqd = b.nsqd - a.nsqd
    other = max(0.0, (b.busy - a.busy) - nsqd - (b.runner - a.runner) - client_cpu)
    return {
        "nsqd_cpu_s": round(nsqd, 3),
        "other_cpu_frac": round(other / (wall * (os.cpu_count() or 1)), 3),
    }


def source_digest(pkg: Path = ROOT / "smartnsq") -> str:
    """Short hash of the library's *.py files, to spot edits during a run."""
    h = hashlib.sha256()
    for f in sorted(pkg.rglob("*.py")):
        h.update(str(f.relative_to(pkg)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def git_describe() -> str:
    """HEAD commit (short) plus "+dirty" when the work tree has changes."""

    def git(*args: str) -> str:
        r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return r.stdout.strip() if r.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "no commit"
    return head + ("+dirty" if git("status", "--porcelain", "--", "smartnsq") else "")


def loadavg() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError):
        return -1.0


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def fmt_rate(x: float) -> str:
    if math.isnan(x):
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e5:
        return f"{x / 1e3:.0f}k"
    if x >= 1e4:
        return f"{x / 1e3:.1f}k"
    return f"{x:,.0f}"


def fmt_mb(kb: float) -> str:
    return f"{kb * 1024 / 1e6:.1f} MB"


def replace_md_section(path: Path, heading: str, body: str) -> None:
    """Replace (or append) the ``## heading`` section of a markdown file,
    leaving every other ``## `` section untouched."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.strip() == f"## {heading}"), None)
    new = [f"## {heading}", "", *body.strip("\n").splitlines()]
    if start is None:
        while lines and not lines[-1].strip():
            lines.pop()
        lines += ["", *new]
    else:
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines)
        )
        tail = lines[end:]
        lines = lines[:start] + new + (["", *tail] if tail else [])
    path.write_text("\n".join(lines) + "\n")
