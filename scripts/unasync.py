"""Generate the blocking producer from the async one.

``smartnsq/producer/io.py`` (sending, waiting, retrying) and ``smartnsq/producer/front.py``
(the front door) are the one source; ``smartnsq/producer/io_sync.py`` and
``smartnsq/sync/producer.py`` are made from them by the token substitutions below, then sorted
and formatted by ruff (the project's own settings), so the output passes ``./dev lint`` as the
source does. What only the blocking producer does is written by hand in
``smartnsq/producer/links_sync.py``, its front door's class docstring included (``DOCS``).

    python scripts/unasync.py          # write the generated files
    python scripts/unasync.py --check  # exit 1 (saying which) when one is stale

Run from anywhere; paths are the repository's.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (async source, generated blocking module), relative to the repository root
FILES = [
    ("smartnsq/producer/io.py", "smartnsq/producer/io_sync.py"),
    ("smartnsq/producer/front.py", "smartnsq/sync/producer.py"),
]

# A generated class whose docstring is not the source's: (class, module, string constant).
DOCS = {
    "smartnsq/sync/producer.py": ("Producer", "smartnsq/producer/links_sync.py", "PRODUCER_DOC"),
}

# Applied in order, each to every line; a pattern matches whole words only.
SUBS = [
    ("async def ", "def "),
    ("async with ", "with "),
    ("``async with``", "``with``"),
    ("await ", ""),
    ("__aenter__", "__enter__"),
    ("__aexit__", "__exit__"),
    ("Publisher", "SyncPublisher"),
    ("Links", "SyncLinks"),
    ("LinkNode", "SyncLinkNode"),
    ("smartnsq.producer.io", "smartnsq.producer.io_sync"),
    ("smartnsq.producer.links", "smartnsq.producer.links_sync"),
    ("import anyio", "import time"),
    ("anyio.current_time()", "time.monotonic()"),
    ("anyio.sleep", "time.sleep"),
    (
        "from smartnsq.net.connection import Connection",
        "from smartnsq.net.blocking import SyncConnection",
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


def docstring(module: str, name: str) -> str:
    """The string constant ``name`` of ``module`` (read, not imported)."""
    tree = ast.parse((ROOT / module).read_text())
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == [name]
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    raise SystemExit(f"unasync: {module} has no string {name}")


def replace_docstring(text: str, cls: str, doc: str, target: str) -> str:
    pattern = re.compile(rf'^(class {cls}\b[^\n]*:\n    """).*?(""")', re.S | re.M)
    out, found = pattern.subn(lambda m: m.group(1) + doc + m.group(2), text, count=1)
    if not found:
        raise SystemExit(f"unasync: {target} has no class {cls} with a docstring")
    return out


def generate(source: str, target: str) -> str:
    text = (ROOT / source).read_text()
    if not text.startswith('"""'):
        raise SystemExit(f"unasync: {source} must start with its docstring")
    body = text[text.index('"""', 3) + 3 :]
    out = header(source) + "".join(unasync_line(line) for line in body.splitlines(True))
    if target in DOCS:
        cls, module, name = DOCS[target]
        out = replace_docstring(out, cls, docstring(module, name), target)
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
