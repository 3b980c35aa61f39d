"""The progress bar of ``smartnsq pub``: count, rate and ETA, on a terminal only."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from smartnsq.cli.tally import Tally

__all__ = ["PubProgress"]


class PubProgress:
    """A rich progress bar on stderr when stderr is a terminal; nothing otherwise.

    ``total`` is the size of the input in bytes when known (regular files): the bar and the
    ETA follow the bytes whose lines were answered, the count and rate follow messages.
    """

    def __init__(self, total: int | None) -> None:
        self.total = total
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if not sys.stderr.isatty():
            return
        columns: list[Any] = [
            TextColumn("{task.fields[published]} published"),
            TextColumn("{task.fields[rate]} msg/s"),
        ]
        if total is not None:
            columns += [BarColumn(), TaskProgressColumn(), TextColumn("ETA"), TimeRemainingColumn()]
        else:
            columns += [TimeElapsedColumn()]
        columns.append(TextColumn("{task.fields[failed]}"))
        self._progress = Progress(*columns, console=Console(file=sys.stderr), transient=False)
        self._task = self._progress.add_task("pub", total=total, published=0, rate=0, failed="")

    def __enter__(self) -> PubProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.refresh()
            self._progress.stop()

    def update(self, tally: Tally, size: int) -> None:
        """Count ``size`` more bytes of input as done, and show ``tally``."""
        if self._progress is None or self._task is None:
            return
        task = self._progress.tasks[0]
        elapsed = task.elapsed or 0.0
        rate = round(tally.published / elapsed) if elapsed > 0 else 0
        self._progress.update(
            self._task,
            advance=size,
            published=tally.published,
            rate=rate,
            failed=f"{tally.failed} failed" if tally.failed else "",
        )
