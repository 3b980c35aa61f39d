"""Build (once) and cache NSQ server binaries.

``ensure_binaries("classic")`` builds nsqd, nsqlookupd, bench_writer and bench_reader of
github.com/nsqio/nsq; ``ensure_binaries("toxiproxy")`` builds Shopify's fault-injecting TCP
proxy ``toxiproxy-server`` (for tests/faults); ``ensure_binaries("youzan")`` finds prebuilt
nsqd and nsqlookupd of the Youzan HA fork (this project never builds them: see
compat/README.md) and makes sure an ``etcd`` with the v2 API is installed.
Binaries are cached under ``compat/.servers/`` (override with ``SMARTNSQ_SERVERS_DIR``) and
mirrored to ``~/.cache/smartnsq/servers/`` so that fresh clones on the same machine reuse them;
a file lock serialises concurrent callers.  All progress output goes to stderr.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

CLASSIC_MODULE = "github.com/nsqio/nsq"
CLASSIC_VERSION = "v1.3.0"
CLASSIC_PACKAGES = {
    "nsqd": "./apps/nsqd",
    "nsqlookupd": "./apps/nsqlookupd",
    "bench_writer": "./bench/bench_writer",
    "bench_reader": "./bench/bench_reader",
}

YOUZAN_VERSION = "v0.3.7-HA.1.12.7"
YOUZAN_PACKAGES = {"nsqd": "./apps/nsqd", "nsqlookupd": "./apps/nsqlookupd"}
YOUZAN_BIN_ENV = "SMARTNSQ_YOUZAN_BIN_DIR"

TOXIPROXY_MODULE = "github.com/Shopify/toxiproxy/v2"
TOXIPROXY_VERSION = "v2.12.0"
TOXIPROXY_PACKAGES = {"toxiproxy-server": "./cmd/server"}

KINDS = ("classic", "youzan", "toxiproxy")
_VERSIONS = {"classic": CLASSIC_VERSION, "youzan": YOUZAN_VERSION, "toxiproxy": TOXIPROXY_VERSION}
_PACKAGES = {
    "classic": CLASSIC_PACKAGES,
    "youzan": YOUZAN_PACKAGES,
    "toxiproxy": TOXIPROXY_PACKAGES,
}


class BuildError(RuntimeError):
    """The servers could not be obtained or built."""


def log(msg: str) -> None:
    print(f"[compat.servers] {msg}", file=sys.stderr, flush=True)


def servers_dir() -> Path:
    """Primary cache: ``SMARTNSQ_SERVERS_DIR`` or ``compat/.servers``."""
    env = os.environ.get("SMARTNSQ_SERVERS_DIR")
    return Path(env) if env else Path(__file__).resolve().parent / ".servers"


def user_cache_dir() -> Path:
    """Secondary, per-user cache shared by all clones on a machine (fresh CI clones reuse it)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "smartnsq" / "servers"


def _version_dir(kind: str) -> str:
    return f"{kind}-{_VERSIONS[kind]}"


def _bin_dir(kind: str) -> Path:
    return servers_dir() / _version_dir(kind)


def _complete(d: Path, names: Sequence[str]) -> bool:
    return (d / ".complete").is_file() and all((d / n).is_file() for n in names)


def _install_dir(src: Path, target: Path) -> None:
    """Copy a finished binary dir to ``target`` atomically (via a sibling temp dir)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another build to finish (lock {path})")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(cmd: Sequence[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    log("$ " + " ".join(cmd))
    proc = subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True)
    if proc.stderr:
        sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        raise BuildError(
            f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-4000:]}"
        )
    return proc.stdout


def _go() -> str:
    go = shutil.which("go")
    if not go:
        raise BuildError(
            "the Go toolchain ('go') is not on PATH; it is needed to build the NSQ servers"
        )
    return go


def _go_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["GOFLAGS"] = "-mod=mod -buildvcs=false"
    env.setdefault("CGO_ENABLED", "0")
    env.update(extra or {})
    return env


def _module_source(module: str, version: str, env: dict[str, str]) -> Path | None:
    """Download a module through the module proxy; return its read-only cache dir or None."""
    proc = subprocess.run(
        [_go(), "mod", "download", "-json", f"{module}@{version}"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
    )
    try:
        info = json.loads(proc.stdout)
    except json.JSONDecodeError:
        info = {}
    if proc.returncode != 0 or "Dir" not in info:
        log(f"could not download {module}@{version}: {info.get('Error') or proc.stderr.strip()}")
        return None
    return Path(info["Dir"])


def _copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    for root, dirs, files in os.walk(dst):
        for name in dirs + files:
            p = Path(root, name)
            if not p.is_symlink():
                p.chmod(p.stat().st_mode | 0o200)
    dst.chmod(dst.stat().st_mode | 0o200)


def _build(
    src: Path, packages: dict[str, str], out: Path, env: dict[str, str], ldflags: str = ""
) -> None:
    cmd = [_go(), "build", "-trimpath"]
    if ldflags:
        cmd.append(f"-ldflags={ldflags}")
    cmd += ["-o", str(out) + os.sep, *packages.values()]
    _run(cmd, cwd=src, env=env)
    for name, pkg in packages.items():
        built = out / Path(pkg).name
        if built.name != name:
            built.rename(out / name)
        if not (out / name).is_file():
            raise BuildError(f"build did not produce {out / name}")


def _build_classic(work: Path, out: Path) -> None:
    env = _go_env()
    src = _module_source(CLASSIC_MODULE, CLASSIC_VERSION, env)
    if src is None:
        raise BuildError(
            f"cannot download {CLASSIC_MODULE}@{CLASSIC_VERSION} through the Go module proxy"
        )
    tree = work / "nsq"
    _copy_tree(src, tree)  # building inside the module keeps its replace directives in force
    _build(tree, CLASSIC_PACKAGES, out, env)


def _build_toxiproxy(work: Path, out: Path) -> None:
    env = _go_env()
    src = _module_source(TOXIPROXY_MODULE, TOXIPROXY_VERSION, env)
    if src is None:
        raise BuildError(
            f"cannot download {TOXIPROXY_MODULE}@{TOXIPROXY_VERSION} through the Go module proxy"
        )
    tree = work / "toxiproxy"
    _copy_tree(src, tree)
    _build(tree, TOXIPROXY_PACKAGES, out, env)


def _prebuilt_youzan() -> Path | None:
    """A folder of prebuilt Youzan binaries named by ``SMARTNSQ_YOUZAN_BIN_DIR``, if any."""
    env = os.environ.get(YOUZAN_BIN_ENV)
    if not env:
        return None
    d = Path(env)
    missing = [n for n in YOUZAN_PACKAGES if not (d / n).is_file()]
    if missing:
        raise BuildError(f"{YOUZAN_BIN_ENV}={d} lacks {', '.join(missing)}")
    return d


def ensure_etcd() -> Path:
    """Return the path of an etcd binary (installing Debian's etcd-server if needed)."""
    found = shutil.which("etcd")
    if found:
        return Path(found)
    apt = shutil.which("apt-get")
    if apt and os.geteuid() == 0:
        log("etcd not found; installing Debian package etcd-server")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        _run([apt, "update"], env=env)
        _run([apt, "install", "-y", "--no-install-recommends", "etcd-server"], env=env)
        found = shutil.which("etcd")
        if found:
            return Path(found)
    raise BuildError(
        "etcd (with the v2 API, i.e. etcd <= 3.5) is required for the youzan cluster but is not on "
        "PATH; install it, e.g. `apt-get install etcd-server` as root"
    )


def ensure_binaries(kind: str) -> dict[str, Path]:
    """Return ``{name: path}`` of the server binaries of ``kind``, building them if missing."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    names = list(_PACKAGES[kind])
    target = _bin_dir(kind)
    shared = user_cache_dir() / _version_dir(kind)
    if not _complete(target, names):
        with _file_lock(servers_dir() / f".{kind}.lock"):
            if not _complete(target, names) and _complete(shared, names):
                log(f"copying cached {kind} servers from {shared}")
                _install_dir(shared, target)
            prebuilt = _prebuilt_youzan() if kind == "youzan" else None
            if not _complete(target, names) and prebuilt is not None:
                log(f"using prebuilt {kind} servers from {prebuilt}")
                with tempfile.TemporaryDirectory() as tmp:
                    out = Path(tmp)
                    for name in names:
                        shutil.copy2(prebuilt / name, out / name)
                    (out / ".complete").write_text(f"{kind} (prebuilt)\n")
                    _install_dir(out, target)
            if not _complete(target, names):
                started = time.monotonic()
                log(f"building {kind} NSQ servers into {target} (one-time, may take minutes)")
                with tempfile.TemporaryDirectory(prefix=f"smartnsq-build-{kind}-") as tmp:
                    work = Path(tmp)
                    out = work / "out"
                    out.mkdir()
                    if kind == "youzan":
                        raise BuildError(
                            f"no Youzan HA servers ({YOUZAN_VERSION}) in {target}, {shared} or "
                            f"{YOUZAN_BIN_ENV}: this project does not build them; put prebuilt "
                            "nsqd and nsqlookupd of that release in one of those places"
                        )
                    (_build_classic if kind == "classic" else _build_toxiproxy)(work, out)
                    (out / ".complete").write_text(f"{kind}\n")
                    _install_dir(out, target)
                    try:
                        _install_dir(out, shared)
                    except OSError as e:
                        log(f"could not populate the per-user cache {shared}: {e}")
                log(f"built {kind} servers in {time.monotonic() - started:.1f}s")
    if not _complete(shared, names):
        try:
            _install_dir(target, shared)
        except OSError as e:
            log(f"could not populate the per-user cache {shared}: {e}")
    result = {name: target / name for name in names}
    if kind == "youzan":
        result["etcd"] = ensure_etcd()
    return result


def main(argv: Sequence[str] | None = None) -> int:
    kinds = list(argv if argv is not None else sys.argv[1:]) or list(KINDS)
    for kind in kinds:
        bins = ensure_binaries(kind)
        log(f"{kind}: " + ", ".join(f"{k}={v}" for k, v in bins.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
