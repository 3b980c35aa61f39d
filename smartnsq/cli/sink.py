"""Files of ``smartnsq to-file``: named by a pattern, rotated, and synced in groups.

A message's line is written to the current file at once, but the message is answered only
after its group of lines has been flushed and fsynced (:meth:`Sink.append` returns then).
One fsync serves every message that arrived since the previous one, so the disk sets the pace
of a group, not of each message.
"""

from __future__ import annotations

import gzip
import os
import socket
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

import anyio
import anyio.to_thread

__all__ = ["DEFAULT_PATTERN", "OutFile", "Sink", "render_name", "with_rev"]

DEFAULT_PATTERN = "{topic}.{hostname}{rev}.%Y-%m-%d_%H.log"


def with_rev(pattern: str) -> str:
    """``pattern`` with a ``{rev}`` field: a pattern without one gets it before its extension,
    so that a name already taken can be varied and no existing file is ever appended to."""
    if "{rev}" in pattern:
        return pattern
    stem, dot, ext = pattern.rpartition(".")
    return f"{stem}{{rev}}.{ext}" if dot and stem else pattern + "{rev}"


def render_name(pattern: str, topic: str, when: float, rev: int) -> str:
    """The file name for ``topic`` at time ``when`` (local time, like nsq_to_file).

    ``{topic}``, ``{hostname}`` and ``{rev}`` (empty, then ``-1``, ``-2``... when a name is
    taken) are filled in, then strftime codes.
    """
    host = socket.gethostname().split(".")[0]
    name = pattern.replace("{topic}", topic).replace("{hostname}", host)
    name = name.replace("{rev}", f"-{rev}" if rev else "")
    return time.strftime(name, time.localtime(when))


@dataclass
class OutFile:
    """One output file: raw file object, optional gzip layer, what has been written."""

    path: str
    key: str  # the name with rev 0: when it changes (a new hour), rotate
    raw: BinaryIO
    gz: gzip.GzipFile | None
    opened: float
    size: int = 0  # bytes written before compression
    lines: int = 0

    def write(self, data: bytes) -> None:
        (self.gz or self.raw).write(data)
        self.size += len(data)
        self.lines += 1

    def flush(self) -> None:
        """Push buffered bytes to the OS (a gzip sync point: readable before it is closed)."""
        if self.gz is not None:
            self.gz.flush(zlib.Z_SYNC_FLUSH)
        self.raw.flush()

    def finish(self) -> None:
        """Write the gzip trailer; the file is then flushed, synced and closed by the caller."""
        if self.gz is not None:
            self.gz.close()  # leaves ``raw`` open: it was passed as fileobj
        self.raw.flush()


@dataclass
class _Group:
    """Lines waiting for the same fsync."""

    done: anyio.Event = field(default_factory=anyio.Event)
    count: int = 0
    error: BaseException | None = None


class Sink:
    """Append lines to the current file; :meth:`sync` makes them durable group by group."""

    def __init__(
        self,
        directory: str,
        topic: str,
        *,
        pattern: str = DEFAULT_PATTERN,
        compress: bool = False,
        rotate_size: int | None = None,
        rotate_interval: float | None = None,
        group_size: int = 100,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = directory
        self.topic = topic
        base = pattern.removesuffix(".gz") if compress else pattern
        self.pattern = with_rev(base) + (".gz" if compress else "")
        self.compress = compress
        self.rotate_size = rotate_size
        self.rotate_interval = rotate_interval
        self.group_size = group_size
        self.clock = clock
        self.current: OutFile | None = None
        self.closing: list[OutFile] = []  # rotated out; closed after their lines are synced
        self.closed: list[OutFile] = []
        self.written = 0
        self._group = _Group()
        self._wake = anyio.Event()
        self._new_dir_entry = False

    # -- writing (event loop) --------------------------------------------------------------------

    async def append(self, body: bytes) -> None:
        """Write ``body`` and a newline; return once they are on disk (raise if that failed)."""
        self._file().write(body + b"\n")
        group = self._group
        group.count += 1
        if group.count >= self.group_size:
            self._wake.set()
        elif group.count == 1:
            self._wake.set()  # the syncer may be idle: let it start the group's clock
        await group.done.wait()
        if group.error is not None:
            raise group.error

    def _file(self) -> OutFile:
        now = self.clock()
        key = render_name(self.pattern, self.topic, now, 0)
        f = self.current
        if f is not None and (
            f.key != key
            or (self.rotate_size is not None and f.size >= self.rotate_size)
            or (self.rotate_interval is not None and now - f.opened >= self.rotate_interval)
        ):
            self.closing.append(f)
            f = self.current = None
        if f is None:
            f = self.current = self._open(key, now)
        return f

    def _open(self, key: str, now: float) -> OutFile:
        rev = 0
        while True:
            name = render_name(self.pattern, self.topic, now, rev)
            path = os.path.join(self.directory, name)
            try:
                raw: BinaryIO = open(path, "xb")  # noqa: SIM115 - closed by finish/sync
            except FileExistsError:
                rev += 1
                continue
            break
        self._new_dir_entry = True
        gz = gzip.GzipFile(filename="", mode="wb", fileobj=raw) if self.compress else None
        return OutFile(path, key, raw, gz, now)

    # -- syncing ---------------------------------------------------------------------------------

    async def run_syncer(self, interval: float) -> None:
        """Sync groups until cancelled: a group is synced when ``group_size`` lines are
        waiting, or ``interval`` seconds after its first line."""
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            if self._group.count == 0:
                continue
            with anyio.move_on_after(interval):
                while self._group.count < self.group_size:
                    await self._wake.wait()
                    self._wake = anyio.Event()
            await self.sync()

    async def sync(self) -> None:
        """Flush and fsync what was written so far, then release the waiting messages."""
        group, self._group = self._group, _Group()
        closing, self.closing = self.closing, []
        files = [*closing, *([self.current] if self.current else [])]
        new_dir_entry, self._new_dir_entry = self._new_dir_entry, False
        try:
            # Buffers are pushed out here, on the loop's thread, where the writes happen;
            # the thread below only fsyncs (and closes files no longer written to).
            for f in closing:
                f.finish()
            if self.current is not None:
                self.current.flush()
            fds = [f.raw.fileno() for f in files]
            await anyio.to_thread.run_sync(_fsync, fds, self.directory if new_dir_entry else None)
        except BaseException as exc:
            group.error = exc if isinstance(exc, Exception) else OSError("sync cancelled")
            raise
        finally:
            for f in closing:
                f.raw.close()
                self.closed.append(f)
            group.done.set()
        self.written += group.count

    async def close(self) -> None:
        """Sync and close everything (at the end: nothing is waiting any more)."""
        if self.current is not None:
            self.closing.append(self.current)
            self.current = None
        await self.sync()


def _fsync(fds: list[int], directory: str | None) -> None:
    for fd in fds:
        os.fsync(fd)
    if directory is not None:
        # A new file's name is durable only once its directory is synced.
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
