"""Output helpers shared by the commands: logging to stderr and JSON lines on stdout."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from smartnsq.cli.options import Common

__all__ = ["configure_logging", "print_json"]


def configure_logging(options: Common, quiet: bool = False) -> None:
    """Send smartnsq's warnings (reconnects, lookup trouble) to stderr, one line each.

    ``quiet``: the command reports every failure itself (pub): warnings only with -v.
    """
    first = logging.ERROR if quiet else logging.WARNING
    level = (first, logging.INFO, logging.DEBUG)[min(options.verbose, 2)]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("smartnsq: %(levelname)s: %(message)s"))
    root = logging.getLogger("smartnsq")
    root.addHandler(handler)
    root.setLevel(level)


def print_json(obj: Any) -> None:
    """One JSON object on one line of stdout, flushed (so a pipe sees it at once)."""
    sys.stdout.write(json.dumps(obj, separators=(",", ":"), default=str) + "\n")
    sys.stdout.flush()
