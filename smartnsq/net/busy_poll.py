"""How long a caller polls for nsqd's answer before it goes to sleep on it.

A request alone in flight waits for one answer that usually comes within tens to a few
hundred microseconds. Sleeping on it (``select``, or an idle event loop) and being woken
costs more than that on a virtual machine, where an idle CPU is halted and takes tens of
microseconds to run again; Go's runtime spins briefly before parking for the same reason.
So the caller first polls, for about twice the time the answers have been taking and never
longer than a limit, and sleeps only when the answer is late.

Between polls the poller gives the CPU away (``sched_yield``): an nsqd thread woken on this
CPU would otherwise wait behind it, and measured, publishes of 200-message batches got faster
with it. An event loop's poll passes yield too: polling without yielding for the first 0.1
ms (as it did before) raised the 99th percentile of publish-to-handler latency at 10k msg/s
on a 2-CPU machine from about 1.5 to 3.5-4.5 ms, and did not make sequential publishes
measurably faster.

Polling pays only a caller that publishes back to back. One that comes back later than the
limit after its last answer paces itself (a rate-limited or request-driven publisher): it
does not poll, and leaves the CPU to nsqd and the consumers on its machine.

Sans-IO: fed the waits it observed and the caller's times, this gives the next poll budget;
the blocking and the async connections do the polling.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

DEFAULT_LIMIT = 0.0005  # seconds: an MPUB of a few hundred small messages is answered sooner


def _sleep_zero() -> None:
    time.sleep(0)


cpu_yield: Callable[[], None] = getattr(os, "sched_yield", _sleep_zero)


class BusyPoll:
    """The poll budget of one connection, from the answer times seen on it."""

    __slots__ = ("_answered", "_typical", "limit")

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self._typical = 0.0  # moving average of the observed waits; 0: none yet
        self._answered = 0.0  # when the last one was answered

    def budget(self, now: float) -> float:
        """Seconds to poll before sleeping, for a request sent at ``now``: 0 when answers
        take longer than the limit (a remote or busy nsqd: polling would only burn CPU), and
        when the caller's last answer came more than the limit before ``now`` (it is not
        publishing back to back)."""
        typical = self._typical
        if not typical:
            return self.limit  # nothing seen yet
        if typical > self.limit or now - self._answered > self.limit:
            return 0.0
        return min(2.0 * typical, self.limit)

    def observe(self, sent: float, answered: float) -> None:
        """A request alone in flight, sent at ``sent``, was answered at ``answered``
        (seconds on one clock)."""
        wait = answered - sent
        typical = self._typical
        self._typical = wait if not typical else typical + (wait - typical) * 0.125
        self._answered = answered
