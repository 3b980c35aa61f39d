"""Per-key order for ``smartnsq to-nsq --key-header / --same-partition``: the copies of one
key go one after another, in the order their messages came; different keys run in parallel."""

from __future__ import annotations

from collections.abc import Hashable

import anyio

__all__ = ["KeyOrder", "Turn"]


class Turn:
    """One message's place in its key's line."""

    __slots__ = ("done", "failed", "previous")

    def __init__(self, previous: Turn | None) -> None:
        self.previous = previous
        self.done = anyio.Event()
        self.failed = False

    async def wait_for_previous(self) -> bool:
        """Wait until the message before it (same key) is done; False if that one was not
        copied, so this one must not be copied ahead of it either."""
        previous, self.previous = self.previous, None  # keep no chain of finished turns
        if previous is None:
            return True
        await previous.done.wait()
        return not previous.failed


class KeyOrder:
    """The line of each key that has a copy in progress."""

    def __init__(self) -> None:
        self._last: dict[Hashable, Turn] = {}

    def enter(self, key: Hashable) -> Turn:
        """Take the next place in ``key``'s line (call before anything waits)."""
        turn = Turn(self._last.get(key))
        self._last[key] = turn
        return turn

    def leave(self, key: Hashable, turn: Turn) -> None:
        """``turn`` is done (copied, or given back with ``failed`` set)."""
        turn.done.set()
        if self._last.get(key) is turn:
            del self._last[key]

    def __len__(self) -> int:
        return len(self._last)
