"""The blocking producer's publishing code is generated from the async one: it must match."""

from __future__ import annotations

import importlib.util
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


def test_substitutions_rename_whole_words_only() -> None:
    spec = importlib.util.spec_from_file_location("unasync", ROOT / "scripts" / "unasync.py")
    assert spec is not None and spec.loader is not None
    unasync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(unasync)
    line = unasync.unasync_line
    assert (
        line("    async def _send(self) -> Connection:\n")
        == "    def _send(self) -> SyncConnection:\n"
    )
    assert (
        line("        answer = await conn.request(data)\n")
        == "        answer = conn.request(data)\n"
    )
    assert (
        line("except (ConnectionClosed, NSQTimeout):") == "except (ConnectionClosed, NSQTimeout):"
    )
    assert line("await anyio.sleep(anyio.current_time())") == "time.sleep(time.monotonic())"
    assert line("class AsyncPublisher(ProducerCore[N]):") == "class SyncPublisher(ProducerCore[N]):"
    assert line("conn.SyncConnection, MyConnection") == "conn.SyncConnection, MyConnection"
