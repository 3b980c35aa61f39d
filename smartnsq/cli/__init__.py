"""The ``smartnsq`` command line (``pip install 'smartnsq[cli]'``).

This package is the only part of smartnsq that uses click and rich; ``import smartnsq`` never
imports it.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from types import FrameType

__all__ = ["main"]


def _exit_quietly(signum: int, frame: FrameType | None) -> None:
    # Ctrl-C while the command line is still loading: nothing has been done yet, so leave
    # at once with Ctrl-C's status, without a KeyboardInterrupt traceback from some import.
    sys.exit(130)


signal.signal(signal.SIGINT, _exit_quietly)

_EXTRA_HINT = "smartnsq: the command line needs extra packages: pip install 'smartnsq[cli]'"


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``smartnsq`` console script and of ``python -m smartnsq``."""
    try:
        try:
            import click  # noqa: F401
            import rich  # noqa: F401
        except ImportError:
            print(_EXTRA_HINT, file=sys.stderr)
            sys.exit(1)
        from smartnsq.cli.app import run

        # Loaded: from here on Ctrl-C is a KeyboardInterrupt again, which the commands handle.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        status = run(argv)
    except KeyboardInterrupt:
        # Ctrl-C while the command is still loading: quietly, like one that is running.
        status = 130
    sys.exit(status)
