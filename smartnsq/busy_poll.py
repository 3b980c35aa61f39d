"""How long a caller polls for nsqd's answer before it goes to sleep on it.

A request alone in flight waits for one answer that usually comes within tens to a few
hundred microseconds. Sleeping on it (``select``, or an idle event loop) and being woken
costs more than that on a virtual machine, where an idle CPU is halted and takes tens of
microseconds to run again; Go's runtime spins briefly before parking for the same reason.
So the caller first polls, for about twice the time the answers have been taking and never
longer than a limit, and sleeps only when the answer is late.

Between polls the poller gives the CPU away (``sched_yield``): an nsqd thread woken on this
CPU would otherwise wait behind it, and measured, publishes of 200-message batches got faster
with it. An event loop's poll passes cost more than a blocking ``recv``, and there yielding
from the start slowed single publishes, so the loop yields only once it has polled for
``LOOP_YIELD_AFTER``.

Sans-IO: fed the waits it observed, this gives the next poll budget; the blocking and the
async connections do the polling.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

DEFAULT_LIMIT = 0.0005  # seconds: an MPUB of a few hundred small messages is answered sooner
LOOP_YIELD_AFTER = 0.0001  # seconds


def _sleep_zero() -> None:
    time.sleep(0)


cpu_yield: Callable[[], None] = getattr(os, "sched_yield", _sleep_zero)


class BusyPoll:
    """The poll budget of one connection, from the answer times seen on it."""

    __slots__ = ("_typical", "limit")

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self._typical = 0.0  # moving average of the observed waits; 0: none yet

    def budget(self) -> float:
        """Seconds to poll before sleeping: 0 when answers take longer than the limit
        (a remote or busy nsqd: polling would only burn CPU)."""
        typical = self._typical
        if typical > self.limit:
            return 0.0
        return min(2.0 * typical, self.limit) if typical else self.limit

    def observe(self, wait: float) -> None:
        """A request alone in flight was answered ``wait`` seconds after it was sent."""
        typical = self._typical
        self._typical = wait if not typical else typical + (wait - typical) * 0.125
