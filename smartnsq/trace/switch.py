"""Run-time trace switches, safe to flip from any task or thread."""

from __future__ import annotations

import threading

from smartnsq.protocol.names import validate_topic


class TraceSwitch:
    """Which topics are traced. Changes take effect for the next publish or message.

    Every Producer and Consumer has one as its ``trace`` attribute. Safe to flip from any
    task or thread: readers never lock, the state is an immutable snapshot swapped under a
    lock by writers.

    Attributes:
        active: Whether any topic is traced at all.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._all = False
        self._on: frozenset[str] = frozenset()
        self._off: frozenset[str] = frozenset()  # exceptions while everything is on
        self.active = False  # any topic traced at all: one attribute read on hot paths

    def enable(self, topic: str | None = None) -> None:
        """Trace ``topic``, or every topic when ``topic`` is None.

        Args:
            topic: The topic to trace; None (default) traces every topic.

        Raises:
            InvalidTopic: ``topic`` breaks NSQ's naming rules.
        """
        with self._lock:
            if topic is None:
                self._all, self._off = True, frozenset()
            else:
                validate_topic(topic)
                self._on = self._on | {topic}
                self._off = self._off - {topic}
            self.active = True

    def disable(self, topic: str | None = None) -> None:
        """Stop tracing ``topic``, or every topic when ``topic`` is None.

        Args:
            topic: The topic to stop tracing (an exception while every topic is traced);
                None (default) stops tracing altogether.

        Raises:
            InvalidTopic: ``topic`` breaks NSQ's naming rules.
        """
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
        """Whether ``topic`` is traced now.

        Args:
            topic: The topic.

        Returns:
            True when ``topic`` is traced.
        """
        if self._all:
            return topic not in self._off
        return topic in self._on
