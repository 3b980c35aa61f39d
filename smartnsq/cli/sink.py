"""Files of ``smartnsq to-file``: named by a pattern, rotated, and synced in groups.

A message's line is written to the current file at once, but the message is answered only
after its group of lines has been flushed and fsynced (:meth:`Sink.append` returns then).
One fsync serves every message that arrived since the previous one, so the disk sets the pace
of a group, not of each message.
"""

from __future__ import annotations

import errno
import gzip
import os
import shutil
import socket
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

import anyio
import anyio.to_thread

__all__ = [
    "DEFAULT_DATETIME",
    "DEFAULT_PATTERN",
    "OutFile",
    "Sink",
    "go_pattern",
    "host_identifier",
    "render_name",
    "with_rev",
]

DEFAULT_PATTERN = "{topic}.{hostname}{rev}.{datetime}.log"
DEFAULT_DATETIME = "%Y-%m-%d_%H"
_GO_TOKENS = {
    "<TOPIC>": "{topic}",
    "<HOST>": "{hostname}",
    "<REV>": "{rev}",
    "<DATETIME>": "{datetime}",
    "<PID>": "{pid}",
}


def go_pattern(pattern: str) -> str:
    """nsq_to_file's ``--filename-format`` tokens (``<TOPIC>.<HOST><REV>.<DATETIME>.log``)
    as this command's fields."""
    for token, field_name in _GO_TOKENS.items():
        pattern = pattern.replace(token, field_name)
    return pattern


def host_identifier(value: str | None) -> str:
    """What ``{hostname}`` stands for: the short host name, or ``--host-identifier`` with
    nsq_to_file's ``<SHORT_HOST>`` and ``<HOSTNAME>`` filled in."""
    hostname = socket.gethostname()
    short = hostname.split(".")[0]
    if value is None:
        return short
    return value.replace("<SHORT_HOST>", short).replace("<HOSTNAME>", hostname)


def with_rev(pattern: str) -> str:
    """``pattern`` with a ``{rev}`` field: a pattern without one gets it before its extension,
    so that a name already taken can be varied and no existing file is ever appended to."""
    if "{rev}" in pattern:
        return pattern
    stem, dot, ext = pattern.rpartition(".")
    return f"{stem}{{rev}}.{ext}" if dot and stem else pattern + "{rev}"


def render_name(
    pattern: str,
    topic: str,
    when: float,
    rev: int,
    host: str | None = None,
    datetime_format: str = DEFAULT_DATETIME,
) -> str:
    """The file name for ``topic`` at time ``when`` (local time, like nsq_to_file).

    ``{topic}``, ``{hostname}`` (``host``, default the short host name), ``{pid}``,
    ``{datetime}`` (``datetime_format``) and ``{rev}`` (empty, then ``-1``, ``-2``... when a
    name is taken) are filled in, then strftime codes.
    """
    local = time.localtime(when)
    name = pattern.replace("{topic}", topic).replace("{hostname}", host or host_identifier(None))
    name = name.replace("{pid}", str(os.getpid()))
    name = name.replace("{datetime}", time.strftime(datetime_format, local).replace("%", "%%"))
    name = name.replace("{rev}", f"-{rev}" if rev else "")
    return time.strftime(name, local)


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
        gzip_level: int = 6,
        rotate_size: int | None = None,
        rotate_interval: float | None = None,
        group_size: int = 100,
        clock: Callable[[], float] = time.time,
        output_dir: str | None = None,
        host: str | None = None,
        datetime_format: str = DEFAULT_DATETIME,
    ) -> None:
        self.directory = directory  # where files are written (nsq_to_file's --work-dir)
        self.output_dir = output_dir or directory  # where finished files go
        self.topic = topic
        self.gzip_level = gzip_level
        self.host = host
        self.datetime_format = datetime_format
        base = pattern.removesuffix(".gz") if compress else pattern
        self.pattern = with_rev(base) + (".gz" if compress else "")
        self.compress = compress
        self.rotate_size = rotate_size
        self.rotate_interval = rotate_interval
        self.group_size = group_size
        self.clock = clock
        self.current: OutFile | None = None
        self.closing: list[OutFile] = []  # rotated out; closed after their lines are synced
        self.closed: list[OutFile] = []  # paths: where they are now (the output dir)
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
        key = self._name(now, 0)
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
            name = self._name(now, rev)
            path = os.path.join(self.directory, name)
            if self.output_dir != self.directory and os.path.exists(
                os.path.join(self.output_dir, name)
            ):
                rev += 1  # a finished file of that name: never overwritten by a move
                continue
            try:
                raw: BinaryIO = open(path, "xb")  # noqa: SIM115 - closed by finish/sync
            except FileExistsError:
                rev += 1
                continue
            break
        self._new_dir_entry = True
        gz = (
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=self.gzip_level)
            if self.compress
            else None
        )
        return OutFile(path, key, raw, gz, now)

    def _name(self, now: float, rev: int) -> str:
        return render_name(self.pattern, self.topic, now, rev, self.host, self.datetime_format)

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
        if closing and self.output_dir != self.directory:
            await anyio.to_thread.run_sync(_move, closing, self.output_dir)

    async def close(self) -> None:
        """Sync and close everything (at the end: nothing is waiting any more)."""
        if self.current is not None:
            self.closing.append(self.current)
            self.current = None
        await self.sync()


def _move(files: list[OutFile], output_dir: str) -> None:
    """Move finished (synced, closed) files from the work directory to the output one."""
    for f in files:
        target = os.path.join(output_dir, os.path.basename(f.path))
        try:
            os.rename(f.path, target)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            shutil.copyfile(f.path, target)  # another file system: copy, sync, then remove
            _fsync_path(target)
            os.unlink(f.path)
        f.path = target
    _fsync_path(output_dir)


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
