"""The ``smartnsq`` command line (``pip install 'smartnsq[cli]'``).

This package is the only part of smartnsq that uses click and rich; ``import smartnsq`` never
imports it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]

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
        # Ctrl-C while the command is still loading: quietly, like one that is running.
        status = 130
    sys.exit(status)
