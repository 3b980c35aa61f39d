"""Build (once) the benchmarks' own go-nsq program, ``bench/go/main.go``.

It is compiled against github.com/nsqio/go-nsq v1.1.0 (fetched through the Go module proxy)
into the compat server cache (``compat.servers.servers_dir()``), next to nsqd and
``bench_writer``, under a folder named after a digest of the source, so an edited source is
rebuilt and an unchanged one never is.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import BENCH_DIR, ROOT, log

GO_NSQ = "github.com/nsqio/go-nsq"
GO_NSQ_VERSION = "v1.1.0"
SOURCE = BENCH_DIR / "go" / "main.go"
GO_MOD = f"""module smartnsq.invalid/bench/nsqgo

go 1.21

require {GO_NSQ} {GO_NSQ_VERSION}
"""


def _digest() -> str:
    return hashlib.sha256(SOURCE.read_bytes() + GO_MOD.encode()).hexdigest()[:12]


def ensure_nsqgo() -> Path:
    """Path of the built ``nsqgo`` binary, building it first if needed."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from compat.servers import servers_dir

    out = servers_dir() / f"nsqgo-{GO_NSQ_VERSION}-{_digest()}" / "nsqgo"
    if out.is_file():
        return out
    go = shutil.which("go")
    if not go:
        raise RuntimeError("the Go toolchain ('go') is needed to build the go-nsq benchmark peer")
    log(f"building {out} (go-nsq {GO_NSQ_VERSION}) ...")
    env = dict(os.environ, GOFLAGS="-mod=mod -buildvcs=false", CGO_ENABLED="0")
    with tempfile.TemporaryDirectory(prefix="nsqgo-build-") as tmp:
        work = Path(tmp)
        shutil.copy(SOURCE, work / "main.go")
        (work / "go.mod").write_text(GO_MOD)
        for cmd in ([go, "mod", "tidy"], [go, "build", "-trimpath", "-o", "nsqgo", "."]):
            r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp_out = out.with_suffix(".tmp")
        shutil.copy2(work / "nsqgo", tmp_out)
        tmp_out.rename(out)
    return out


if __name__ == "__main__":
    print(ensure_nsqgo())
