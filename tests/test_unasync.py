"""The blocking producer's publishing code is generated from the async one: it must match."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_generated_sync_code_is_up_to_date() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "unasync.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_generated_file_says_it_is_generated() -> None:
    first = (ROOT / "smartnsq" / "sync" / "publish_io.py").read_text().splitlines()[0]
    assert first.startswith("# Generated from smartnsq/publish_io.py by scripts/unasync.py")
