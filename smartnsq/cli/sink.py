"""Files of ``smartnsq to-file``: named by a pattern, rotated, and synced in groups.

A message's line is written to the current file at once, but the message is answered only
after its group of lines has been flushed and fsynced (:meth:`Sink.append` returns then).
One fsync serves every message that arrived since the previous one, so the disk sets the pace
of a group, not of each message.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
import socket
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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


# A final, empty fixed-Huffman block: after a sync point it ends the deflate stream.
_FINAL_EMPTY_BLOCK = b"\x03\x00"


@dataclass
class Mark:
    """A point of a file where it could end as a whole file: after a line (and, for gzip,
    after a sync point, with the checksum and size of what it holds)."""

    offset: int = 0
    crc: int = 0
    size: int = 0


@dataclass
class OutFile:
    """One output file, written by hand so that a failed write leaves nothing unknown: lines
    are buffered here (compressed, for gzip), handed to the OS at :meth:`flush`, and a file
    can always be cut back to its last synced line (:meth:`cut`), a valid gzip included."""

    path: str
    key: str  # the name with rev 0: when it changes (a new hour), rotate
    raw: io.FileIO
    gz: Any  # a zlib compressor (raw deflate), or None
    opened: float
    size: int = 0  # bytes written before compression
    lines: int = 0
    crc: int = 0  # CRC-32 of what was written (gzip)
    written: int = 0  # bytes handed to the OS
    pending: bytearray = field(default_factory=bytearray)
    flushed: Mark = field(default_factory=Mark)  # at the last flush
    synced: Mark | None = None  # at the last fsync; None: nothing synced yet
    finished: bool = False

    def write(self, data: bytes) -> None:
        if self.gz is not None:
            self.crc = zlib.crc32(data, self.crc)
            self.pending += self.gz.compress(data)
        else:
            self.pending += data
        self.size += len(data)
        self.lines += 1

    def flush(self) -> None:
        """Hand buffered bytes to the OS (a gzip sync point: readable before it is closed)."""
        if self.gz is not None:
            self.pending += self.gz.flush(zlib.Z_SYNC_FLUSH)
        self._write_pending()
        self.flushed = Mark(self.written, self.crc, self.size)

    def finish(self) -> None:
        """End the file (the gzip trailer); it is then synced and closed by the caller."""
        if self.gz is not None:
            self.pending += self.gz.flush(zlib.Z_FINISH) + _trailer(self.crc, self.size)
        self._write_pending()
        self.flushed = Mark(self.written, self.crc, self.size)
        self.finished = True

    def cut(self) -> bool:
        """After a failed write or a hurried stop: cut the file back to its last synced line
        and end it there (a valid gzip). False: nothing was synced, the file is removed."""
        self.pending.clear()
        if self.finished and self.synced is not None and self.synced.offset == self.written:
            self.raw.close()  # whole and synced, trailer included
            return True
        if self.synced is None:
            self.raw.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            return False
        mark = self.synced
        fd = self.raw.fileno()
        os.ftruncate(fd, mark.offset)
        if self.gz is not None:
            tail = _FINAL_EMPTY_BLOCK + _trailer(mark.crc, mark.size)
            os.pwrite(fd, tail, mark.offset)
        os.fsync(fd)
        self.raw.close()
        self.finished = True
        return True

    def _write_pending(self) -> None:
        view = memoryview(self.pending)
        done = 0
        try:
            while done < len(view):
                n = self.raw.write(view[done:])
                done += n or 0
        finally:
            view.release()
            self.written += done
            del self.pending[:done]


def gzip_header(level: int, mtime: float) -> bytes:
    """A gzip member's header as Python's gzip module writes it (no file name)."""
    xfl = 2 if level == 9 else 4 if level == 1 else 0  # best / fastest compression
    return b"\x1f\x8b\x08\x00" + struct.pack("<LBB", int(mtime), xfl, 255)


def _trailer(crc: int, size: int) -> bytes:
    return struct.pack("<II", crc & 0xFFFFFFFF, size & 0xFFFFFFFF)


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
        self.error: OSError | None = None  # the first failed open, write or sync: no more lines
        self._syncing: list[OutFile] = []  # files whose fsync is under way
        self._group = _Group()
        self._wake = anyio.Event()
        self._new_dir_entry = False

    # -- writing (event loop) --------------------------------------------------------------------

    async def append(self, body: bytes) -> None:
        """Write ``body`` and a newline; return once they are on disk (raise OSError if that
        failed: the sink then takes no more lines)."""
        if self.error is not None:
            raise self.error
        try:
            f = self._file()
        except OSError as exc:
            self.error = exc
            raise
        f.write(body + b"\n")
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
                # Unbuffered: OutFile buffers, so a failed write leaves no hidden bytes.
                raw = io.FileIO(path, "xb")
            except FileExistsError:
                rev += 1
                continue
            break
        self._new_dir_entry = True
        gz = (
            zlib.compressobj(self.gzip_level, zlib.DEFLATED, -zlib.MAX_WBITS)
            if self.compress
            else None
        )
        f = OutFile(path, key, raw, gz, now)
        if gz is not None:
            f.pending += gzip_header(self.gzip_level, now)
        return f

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
        """Flush and fsync what was written so far, then release the waiting messages.

        A failure (a full disk, an unwritable directory) is kept in :attr:`error` and given to
        the waiting messages; the files are cut back to their last synced line by
        :meth:`close`."""
        group, self._group = self._group, _Group()
        closing, self.closing = self.closing, []
        files = [*closing, *([self.current] if self.current else [])]
        new_dir_entry, self._new_dir_entry = self._new_dir_entry, False
        try:
            if self.error is not None:
                raise self.error
            # Bytes are handed to the OS here, on the loop's thread, where the writes happen;
            # the thread below only fsyncs.
            for f in closing:
                f.finish()
            if self.current is not None:
                self.current.flush()
            marks = [(f, f.flushed) for f in files]
            self._syncing = files
            fds = [f.raw.fileno() for f in files]
            await anyio.to_thread.run_sync(_fsync, fds, self.directory if new_dir_entry else None)
            for f, mark in marks:
                f.synced = mark
        except BaseException as exc:
            self.closing = closing + self.closing  # cut back and closed by close()
            if isinstance(exc, OSError):
                self.error = self.error or exc
                group.error = exc
                return
            group.error = OSError("sync cancelled")
            raise
        finally:
            self._syncing = []
            group.done.set()
        for f in closing:
            f.raw.close()
            self.closed.append(f)
        self.written += group.count
        if closing and self.output_dir != self.directory:
            await anyio.to_thread.run_sync(_move, closing, self.output_dir)

    async def close(self) -> None:
        """Sync and close everything (at the end: nothing is waiting any more). After a
        failure, each open file is cut back to its last synced line instead."""
        if self.current is not None:
            self.closing.append(self.current)
            self.current = None
        await self.sync()
        if self.error is not None:
            self.abort()

    def abort(self) -> None:
        """End every open file at once, without waiting (a second signal, or after a
        failure): each is cut back to its last synced line, a valid file, and moved to the
        output directory; a file with nothing synced is removed."""
        files: dict[int, OutFile] = {}
        for f in [*self._syncing, *self.closing, self.current]:
            if f is not None and not f.raw.closed:
                files[id(f)] = f
        self.closing, self.current = [], None
        kept: list[OutFile] = []
        for f in files.values():
            try:
                if f.cut():
                    kept.append(f)
            except OSError:
                f.raw.close()  # a disk that refuses even this: left in the work directory
        self.closed.extend(kept)
        if kept and self.output_dir != self.directory:
            with contextlib.suppress(OSError):
                _move(kept, self.output_dir)


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
