"""Generate the blocking producer's publishing code from the async one.

``smartnsq/publish_io.py`` is the one source; ``smartnsq/sync/publish_io.py`` is made from it
by the token substitutions below, then sorted and formatted by ruff (the project's own
settings), so the output passes ``./dev lint`` as the source does.

    python scripts/unasync.py          # write the generated files
    python scripts/unasync.py --check  # exit 1 (saying which) when one is stale

Run from anywhere; paths are the repository's.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (async source, generated blocking module), relative to the repository root
FILES = [("smartnsq/publish_io.py", "smartnsq/sync/publish_io.py")]

# Applied in order, each to every line; a pattern matches whole words only.
SUBS = [
    ("async def ", "def "),
    ("async with ", "with "),
    ("await ", ""),
    ("AsyncPublisher", "SyncPublisher"),
    ("import anyio", "import time"),
    ("anyio.current_time()", "time.monotonic()"),
    ("anyio.sleep", "time.sleep"),
    (
        "from smartnsq.connection import Connection",
        "from smartnsq.sync.connection import SyncConnection",
    ),
    ("Connection", "SyncConnection"),
]
_COMPILED = [
    (re.compile(r"(?<![\w.])" + re.escape(old) + (r"(?!\w)" if old[-1].isalnum() else "")), new)
    for old, new in SUBS
]


def header(source: str) -> str:
    """The generated module's comment and docstring (the source's docstring is the source's)."""
    return (
        f"# Generated from {source} by scripts/unasync.py: do not edit.\n"
        f"# Edit {source}, then run `python scripts/unasync.py`.\n"
        f'"""The blocking twin of :mod:`{source[:-3].replace("/", ".")}`, generated from it:'
        ' see that module."""\n'
    )


def unasync_line(line: str) -> str:
    for pattern, new in _COMPILED:
        line = pattern.sub(new, line)
    return line


def ruff(args: list[str], text: str, name: str) -> str:
    """``text`` through ``ruff ARGS`` with the project's settings, as if it were ``name``."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", name, "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"unasync: ruff {' '.join(args)} failed on {name}:\n{done.stderr}")
    return done.stdout


def generate(source: str, target: str) -> str:
    text = (ROOT / source).read_text()
    if not text.startswith('"""'):
        raise SystemExit(f"unasync: {source} must start with its docstring")
    body = text[text.index('"""', 3) + 3 :]
    out = header(source) + "".join(unasync_line(line) for line in body.splitlines(True))
    # Import order changes with the names (smartnsq.sync.* sorts last): ruff puts it right.
    out = ruff(["check", "--fix-only", "--select", "I", "--quiet"], out, target)
    return ruff(["format", "--quiet"], out, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say whether files are stale")
    check = parser.parse_args(argv).check
    stale = []
    for source, target in FILES:
        wanted = generate(source, target)
        path = ROOT / target
        if path.exists() and path.read_text() == wanted:
            continue
        if check:
            stale.append(target)
        else:
            path.write_text(wanted)
            print(f"unasync: wrote {target}")
    if stale:
        print(
            f"unasync: {', '.join(stale)} is stale: run `python scripts/unasync.py`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
