"""The consumer's backoff, sans-IO: how handler results move the level and open windows.

As go-nsq does it: a failure raises the level (up to ``max_level``) and opens a window of
``unit * 2**level`` seconds (at most ``max_duration``, shortened by up to 20 % at random) in
which nothing is received; when it runs out, one message is let through, and its result
decides the next step. A success lowers the level; at level 0 full RDY resumes. Results that
come in while a window is open do not count. The consumer does the I/O: RDY 0, the timer,
the one-message probe, RDY back.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Window:
    """Stop receiving for ``interval`` seconds; then :meth:`Backoff.window_over`."""

    interval: float
    epoch: int
    entering: bool  # the level was 0 before: the consumer starts backing off


RESUME: Final = "resume"  # back at level 0: give every connection its RDY again


class Backoff:
    __slots__ = ("_uniform", "blocked", "epoch", "level", "max_duration", "max_level", "unit")

    def __init__(
        self,
        unit: float,
        max_duration: float,
        uniform: Callable[[float, float], float] = random.uniform,
    ) -> None:
        self.unit = unit
        self.max_duration = max_duration
        self.max_level = max(1, math.ceil(math.log2(max_duration / unit)))
        self.level = 0
        self.blocked = False  # a window is open
        self.epoch = 0  # the current window; a timer for an older one is stale
        self._uniform = uniform

    def result(self, success: bool) -> Window | str | None:
        """Count one handler result: a :class:`Window` to open, :data:`RESUME`, or None."""
        if self.blocked:
            return None
        entering = self.level == 0
        if success:
            if self.level == 0:
                return None
            self.level -= 1
        else:
            self.level = min(self.level + 1, self.max_level)
        if self.level == 0:
            return RESUME
        self.blocked = True
        self.epoch += 1
        interval = min(self.unit * 2**self.level, self.max_duration)
        return Window(interval * self._uniform(0.8, 1.0), self.epoch, entering)

    def window_over(self, epoch: int) -> bool:
        """Window ``epoch`` has run out: True when it is still the current one (the consumer
        then lets one message through)."""
        if epoch != self.epoch:
            return False
        self.blocked = False
        return True

    def cancel(self) -> None:
        """The consumer stops: the open window's timer must do nothing."""
        self.epoch += 1
