"""Run-time trace switches, safe to flip from any task or thread."""

from __future__ import annotations

import threading

from smartnsq.protocol.names import validate_topic


class TraceSwitch:
    """Which topics are traced. Changes take effect for the next publish or message.

    Readers never lock: the state is an immutable snapshot swapped under a lock by writers.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._all = False
        self._on: frozenset[str] = frozenset()
        self._off: frozenset[str] = frozenset()  # exceptions while everything is on
        self.active = False  # any topic traced at all: one attribute read on hot paths

    def enable(self, topic: str | None = None) -> None:
        """Trace ``topic``, or every topic when ``topic`` is None."""
        with self._lock:
            if topic is None:
                self._all, self._off = True, frozenset()
            else:
                validate_topic(topic)
                self._on = self._on | {topic}
                self._off = self._off - {topic}
            self.active = True

    def disable(self, topic: str | None = None) -> None:
        """Stop tracing ``topic``, or every topic when ``topic`` is None."""
        with self._lock:
            if topic is None:
                self._all, self._on, self._off = False, frozenset(), frozenset()
                self.active = False
            else:
                validate_topic(topic)
                self._on = self._on - {topic}
                if self._all:
                    self._off = self._off | {topic}
            self.active = self._all or bool(self._on)

    def enabled(self, topic: str) -> bool:
        if self._all:
            return topic not in self._off
        return topic in self._on
