"""The files of to-file: names, rotation by size, time and hour, and when lines are released."""

from __future__ import annotations

import gzip
import time

import anyio
import pytest

from smartnsq.cli.sink import Sink, render_name, with_rev

pytestmark = pytest.mark.anyio

HOUR = 3600.0


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_render_name_fills_fields_and_adds_rev_before_the_extension():
    when = time.mktime((2024, 5, 6, 7, 0, 0, 0, 0, -1))
    pattern = with_rev("{topic}.%Y-%m-%d_%H.log")
    assert render_name(pattern, "t", when, 0) == "t.2024-05-06_07.log"
    assert render_name(pattern, "t", when, 2) == "t.2024-05-06_07-2.log"
    assert render_name(with_rev("{topic}{rev}-100%%"), "t", when, 1) == "t-1-100%"
    assert with_rev("{topic}") == "{topic}{rev}"


async def test_rotation_by_size_time_and_hour(tmp_path, anyio_backend):
    clock = Clock(time.mktime((2024, 5, 6, 7, 0, 0, 0, 0, -1)))
    sink = Sink(
        str(tmp_path), "t", pattern="{topic}{rev}.%H.log", rotate_size=10,
        rotate_interval=60, group_size=1, clock=clock,
    )  # fmt: skip
    async with anyio.create_task_group() as tg:
        tg.start_soon(sink.run_syncer, 0.01)
        await sink.append(b"12345")  # t.07.log
        await sink.append(b"67890")  # 12 bytes now: the next line starts a new file
        await sink.append(b"a")  # t-1.07.log
        clock.now += 61
        await sink.append(b"b")  # too old: t-2.07.log
        clock.now += HOUR
        await sink.append(b"c")  # a new hour: t.08.log
        tg.cancel_scope.cancel()
    await sink.close()
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert files == {
        "t.07.log": b"12345\n67890\n",
        "t-1.07.log": b"a\n",
        "t-2.07.log": b"b\n",
        "t.08.log": b"c\n",
    }
    assert sink.written == 5 and all(f.raw.closed for f in sink.closed)


async def test_existing_files_are_never_appended_to(tmp_path, anyio_backend):
    (tmp_path / "t.log.gz").write_bytes(b"old")
    sink = Sink(str(tmp_path), "t", pattern="{topic}.log", compress=True, group_size=1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(sink.run_syncer, 0.01)
        await sink.append(b"new")
        tg.cancel_scope.cancel()
    await sink.close()
    assert (tmp_path / "t.log.gz").read_bytes() == b"old"
    assert gzip.decompress((tmp_path / "t-1.log.gz").read_bytes()) == b"new\n"


async def test_lines_wait_for_the_sync_of_their_group(tmp_path, anyio_backend):
    sink = Sink(str(tmp_path), "t", group_size=3)
    done: list[bytes] = []

    async def write(body: bytes) -> None:
        await sink.append(body)
        done.append(body)

    async with anyio.create_task_group() as tg:
        tg.start_soon(sink.run_syncer, 3600)  # only a full group syncs
        for body in (b"1", b"2"):
            tg.start_soon(write, body)
        await anyio.wait_all_tasks_blocked()
        assert done == []  # written, but not synced: not released
        tg.start_soon(write, b"3")
        with anyio.fail_after(10):
            while len(done) < 3:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    await sink.close()
    assert sorted(done) == [b"1", b"2", b"3"] and sink.written == 3


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
async def test_abort_cuts_files_back_to_their_last_synced_line(tmp_path, anyio_backend, compress):
    sink = Sink(str(tmp_path), "t", pattern="{topic}.log", compress=compress, group_size=1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(sink.run_syncer, 0.01)
        await sink.append(b"synced")
        tg.cancel_scope.cancel()
    f = sink.current
    assert f is not None
    f.write(b"flushed, not synced\n")
    f.flush()
    f.write(b"buffered")  # a partial line, never flushed
    sink.abort()
    (path,) = tmp_path.iterdir()
    data = path.read_bytes()
    assert (gzip.decompress(data) if compress else data) == b"synced\n"
    assert sink.closed == [f] and f.raw.closed
