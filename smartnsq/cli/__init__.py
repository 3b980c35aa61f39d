"""The ``smartnsq`` command line (``pip install 'smartnsq[cli]'``).

This package is the only part of smartnsq that uses click and rich; ``import smartnsq`` never
imports it.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

__all__ = ["main"]


def _exit_quietly(signum: int, frame: FrameType | None) -> None:
    # Ctrl-C before the command watches for it itself (each long-running command opens its
    # own signal receiver, which stops it gracefully): nothing has been sent yet, so leave at
    # once with Ctrl-C's status. Not an exception: one raised at an arbitrary point of an
    # import or of the event loop's start could be caught there and leave the command running.
    os._exit(128 + signum)  # 130 after SIGINT, 143 after SIGTERM (see cli.status)


signal.signal(signal.SIGINT, _exit_quietly)
signal.signal(signal.SIGTERM, _exit_quietly)

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

        status = run(argv)
    except KeyboardInterrupt:
        # Ctrl-C after a command closed its own signal receiver: quietly, as while it ran.
        status = 130
    sys.exit(status)
