"""Every command's exit status, and the verdict its JSON summary carries.

0 only when everything asked for was done; 130 after SIGINT (Ctrl-C), 143 after SIGTERM
(128 + the signal's number, as a shell reports a process the signal killed); 1 with a
one-line reason on stderr otherwise. A failure outranks a signal: a run that failed and was
then interrupted still did not do what was asked.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import anyio

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_SIGINT",
    "EXIT_SIGTERM",
    "EXIT_USAGE",
    "STOP_SIGNALS",
    "Verdict",
    "exit_now",
    "signal_status",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_SIGINT = 128 + signal.SIGINT
EXIT_SIGTERM = 128 + signal.SIGTERM
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def signal_status(signum: int) -> int:
    """The exit status after ``signum`` stopped a command."""
    return EXIT_SIGTERM if signum == signal.SIGTERM else EXIT_SIGINT


def exit_now(status: int) -> None:
    """Leave at once (a second signal): flush what was printed, skip every cleanup."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)


class Verdict:
    """What became of a command's run: done, interrupted by a signal, or failed (and why)."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.signal: int | None = None
        self.error: str | None = None

    @property
    def interrupted(self) -> bool:
        return self.signal is not None

    def interrupt(self, signum: int) -> None:
        """Record the first stop signal."""
        if self.signal is None:
            self.signal = signum

    def fail(self, reason: str) -> None:
        """Record the first failure, as one line."""
        if self.error is None:
            self.error = " ".join(reason.split())

    @property
    def status(self) -> int:
        if self.error is not None:
            return EXIT_FAILED
        if self.signal is not None:
            return signal_status(self.signal)
        return EXIT_OK

    def fields(self) -> dict[str, Any]:
        """The verdict for a JSON summary: ``ok``, ``status`` and ``exit_status`` agree."""
        status = self.status
        word = "ok" if status == EXIT_OK else "failed" if status == EXIT_FAILED else "interrupted"
        return {"ok": status == EXIT_OK, "status": word, "exit_status": status, "error": self.error}

    def finish(self) -> int:
        """Say the failure on stderr (one line) and return the exit status."""
        if self.error is not None:
            print(f"smartnsq {self.command}: error: {self.error}", file=sys.stderr, flush=True)
        return self.status

    async def watch_signals(
        self, first: Callable[[], None], again: Callable[[int], None] | None = None
    ) -> None:
        """Until cancelled: the first SIGINT or SIGTERM is recorded and calls ``first`` (a
        graceful stop); each later one calls ``again`` (stop waiting). The receiver stays
        open, so a second signal never falls through to the default action (an abrupt end)."""
        with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
            async for signum in signals:
                if self.signal is None:
                    self.interrupt(signum)
                    first()
                elif again is not None:
                    again(self.signal)
