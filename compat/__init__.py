"""Obtain real NSQ server binaries and run throw-away loopback clusters for tests.

Public API (imported lazily so that ``python -m compat.cluster`` stays warning-free)::

    from compat import Cluster, ClusterError, ensure_binaries, create_topic
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Cluster": "compat.cluster",
    "ClusterError": "compat.cluster",
    "Daemon": "compat.cluster",
    "BuildError": "compat.servers",
    "ensure_binaries": "compat.servers",
    "servers_dir": "compat.servers",
    "create_topic": "compat.youzan",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'compat' has no attribute {name!r}")
