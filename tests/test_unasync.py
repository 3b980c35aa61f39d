"""Generated code must match its source: the blocking producer (its IO and its front door),
from the async one, and the Consumers' signatures, from their options. These checks run
ruff, which only the dev environment has (``./dev test-on`` leaves this file out)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_generated_sync_code_is_up_to_date() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "unasync.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_consumers_written_signatures_are_up_to_date() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "consumer_options.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("smartnsq/producer/io.py", "smartnsq/producer/io_sync.py"),
        ("smartnsq/producer/front.py", "smartnsq/sync/producer.py"),
    ],
)
def test_generated_files_say_they_are_generated(source: str, target: str) -> None:
    first = (ROOT / target).read_text().splitlines()[0]
    assert first.startswith(f"# Generated from {source} by scripts/unasync.py")


def test_the_blocking_front_door_has_its_own_class_docstring() -> None:
    from smartnsq import Producer
    from smartnsq.producer.links_sync import PRODUCER_DOC
    from smartnsq.sync import Producer as SyncProducer

    assert SyncProducer.__doc__ == PRODUCER_DOC
    assert "async with" in (Producer.__doc__ or "") and "async with" not in PRODUCER_DOC


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
    assert line("class Publisher:") == "class SyncPublisher:"
    assert line("from smartnsq.producer.io import Publisher") == (
        "from smartnsq.producer.io_sync import SyncPublisher"
    )
    assert (
        line("    async def __aenter__(self) -> Producer:")
        == "    def __enter__(self) -> Producer:"
    )
    assert line("conn.SyncConnection, MyConnection") == "conn.SyncConnection, MyConnection"
