"""Logging policy shared by the clients: repeated failures of one kind do not flood."""

from __future__ import annotations

import logging

from smartnsq.errors import ServerError


class OncePerKind:
    """An ``on_async_error`` for one connection: each kind of error is logged at WARNING
    the first time, then at DEBUG (say, E_FIN_FAILED for every message of a slow batch)."""

    __slots__ = ("_address", "_log", "_seen")

    def __init__(self, log: logging.Logger, address: str) -> None:
        self._log = log
        self._address = address
        self._seen: set[type[ServerError]] = set()

    def __call__(self, err: ServerError) -> None:
        kind = type(err)
        if kind in self._seen:
            self._log.debug("nsqd %s: %s", self._address, err)
            return
        self._seen.add(kind)
        self._log.warning(
            "nsqd %s: %s (more %s on this connection at DEBUG)", self._address, err, kind.__name__
        )
