"""Reading the input of ``smartnsq pub`` in a thread: lines (or whole files) in chunks."""

from __future__ import annotations

import os
import stat
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Chunk", "input_size", "read_chunks", "start_reader"]

READ_SIZE = 1 << 16
STDIN = "-"


@dataclass(frozen=True, slots=True)
class Chunk:
    """Lines read in one go from one source.

    ``first`` is the line number of ``lines[0]`` (1-based); ``size`` the bytes of input they
    took (newlines included), for the progress bar.
    """

    source: str
    first: int
    lines: list[bytes]
    size: int

    @property
    def last(self) -> int:
        return self.first + len(self.lines) - 1


def _label(source: str) -> str:
    return "<stdin>" if source == STDIN else source


def input_size(sources: Sequence[str]) -> int | None:
    """Total bytes to read when every source is a regular file (else None: no ETA)."""
    total = 0
    for source in sources:
        try:
            st = os.stat(sys.stdin.fileno()) if source == STDIN else os.stat(source)
        except (OSError, ValueError):
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        total += st.st_size
    return total


def _lines(parts: list[bytes], delimiter: bytes) -> list[bytes]:
    if delimiter != b"\n":
        return parts
    return [p[:-1] if p.endswith(b"\r") else p for p in parts]


def read_chunks(
    sources: Sequence[str],
    raw: bool,
    emit: Callable[[Chunk], None],
    stop: threading.Event,
    delimiter: bytes = b"\n",
) -> None:
    """Read every source in turn and hand what was read to ``emit``.

    ``os.read`` returns what is available, so lines typed or piped slowly go out at once while
    a big file is read 64 KiB at a time. With ``raw`` each source is one message. Lines end
    at ``delimiter`` (one byte; a newline also drops a ``\r`` before it).
    """
    for source in sources:
        if stop.is_set():
            return
        fd = sys.stdin.fileno() if source == STDIN else os.open(source, os.O_RDONLY)
        try:
            if raw:
                data = b"".join(iter(lambda fd=fd: os.read(fd, READ_SIZE), b""))  # type: ignore[misc]
                emit(Chunk(_label(source), 1, [data], len(data)))
                continue
            pending, line = b"", 1
            while not stop.is_set():
                data = os.read(fd, READ_SIZE)
                if not data:
                    break
                buf = pending + data
                parts = buf.split(delimiter)
                pending = parts.pop()
                if parts:
                    chunk = Chunk(
                        _label(source), line, _lines(parts, delimiter), len(buf) - len(pending)
                    )
                    emit(chunk)
                    line = chunk.last + 1
            if pending and not stop.is_set():
                emit(Chunk(_label(source), line, _lines([pending], delimiter), len(pending)))
        finally:
            if source != STDIN:
                os.close(fd)


def start_reader(
    sources: Sequence[str],
    raw: bool,
    emit: Callable[[Chunk | BaseException | None], None],
    stop: threading.Event,
    delimiter: bytes = b"\n",
) -> threading.Thread:
    """Run :func:`read_chunks` in a daemon thread; ``emit(None)`` at the end, or the error.

    A daemon thread, because a read from a terminal cannot be interrupted: on Ctrl-C the
    process must be able to exit while it is blocked.
    """

    def body() -> None:
        # ``emit`` swallows its own failures (the publisher stopped listening), so nothing
        # escapes this thread as a traceback.
        try:
            read_chunks(sources, raw, emit, stop, delimiter)
        except Exception as exc:
            emit(exc)
        else:
            emit(None)

    thread = threading.Thread(target=body, name="smartnsq-pub-reader", daemon=True)
    thread.start()
    return thread
