"""Pacing: how many messages each connection may hold (RDY), and backoff after failures.

The arithmetic is elsewhere (:mod:`smartnsq.rdy` spreads ``max_in_flight``,
:mod:`smartnsq.backoff` keeps the level and its windows); this drives them over the
subscriptions.
"""

from __future__ import annotations

import logging
import random
import time

import anyio

from smartnsq.backoff import RESUME, Backoff, Window
from smartnsq.consumer.state import State
from smartnsq.rdy import distribute

log = logging.getLogger("smartnsq.consumer")

PROBE_MOVE = 0.5  # seconds a backoff probe waits on a connection before it moves on


class Pacing:
    __slots__ = ("backoff", "enabled", "state", "wake")

    def __init__(self, state: State) -> None:
        self.state = state
        self.wake: anyio.Event | None = None  # set when RDY needs the periodic look again
        options = state.options
        self.enabled = options.backoff
        self.backoff = Backoff(options.backoff_unit, options.max_backoff_duration)

    def result(self, success: bool) -> None:
        """Count one handler result (see smartnsq.backoff) and do what it asks."""
        state = self.state
        if state.stopping:
            return
        step = self.backoff.result(success)
        if step is None:
            return
        if step == RESUME:
            log.info("backoff over; resuming full RDY")
            self.redistribute()
            return
        assert isinstance(step, Window)
        for sub in state.subs.values():
            sub.set_rdy(0)
        log.log(
            logging.INFO if step.entering else logging.DEBUG,
            "backing off for %.2fs (level %d)",
            step.interval,
            self.backoff.level,
        )
        state.spawn(self._end_window, step.interval, step.epoch)

    def failed(self) -> None:
        """A handler failure that counts for backoff (when it is on, and not stopping)."""
        if self.enabled and not self.state.stopping:
            self.result(success=False)

    async def _end_window(self, interval: float, epoch: int) -> None:
        await anyio.sleep(interval)
        state, backoff = self.state, self.backoff
        if state.stopping or not backoff.window_over(epoch):
            return
        # Test the waters with one message. Only its result ends the backoff, so while the
        # connection given RDY 1 has nothing to send (an empty partition, an idle nsqd),
        # the probe moves on to the others in turn.
        turn = random.randrange(1 << 16)
        while not state.stopping and state.max_in_flight and backoff.epoch == epoch:
            subs = state.usable()
            if not backoff.level or not subs:
                return  # resumed (RESUME redistributed), or nobody to ask
            sub = subs[turn % len(subs)]
            turn += 1
            received = sub.received
            sub.set_rdy(1)
            await anyio.sleep(PROBE_MOVE)
            if sub.received != received or backoff.epoch != epoch or not backoff.level:
                return  # a message came: its result decides
            sub.set_rdy(0)

    def redistribute(self) -> bool:
        """Hand out ``max_in_flight`` again. True when there is nothing a later look could
        change before something else calls this (an even share, a backoff, no connection)."""
        state = self.state
        if state.stopping:
            return True
        subs = state.usable()
        if not subs:
            return True
        if self.backoff.level:
            if state.max_in_flight == 0:
                for s in subs:
                    s.set_rdy(0)
            return True  # the backoff window decides
        mif, n = state.max_in_flight, len(subs)
        if mif >= n and not mif % n:
            # An even share with no remainder and no cap: distribute() would hand every
            # connection what it has, now and at every later look.
            share = mif // n
            if all(s.rdy == share and s.max_rdy >= share for s in subs):
                return True
        now = time.monotonic()
        options = state.options
        targets = distribute(
            state.max_in_flight,
            [(s.rdy, s.max_rdy, now - s.last_message, now - s.rdy_since) for s in subs],
            low_rdy_idle_timeout=options.low_rdy_idle_timeout,
            rotate_after=options.rdy_redistribute_interval,
        )
        # Lower first, then raise: the RDY we hand out never sums above max_in_flight.
        for target, sub in sorted(zip(targets, subs, strict=True), key=lambda t: t[0] - t[1].rdy):
            if target != sub.rdy:
                sub.set_rdy(target)
        if self.wake is not None:
            self.wake.set()
        return False

    def pause(self) -> None:
        """RDY 0 everywhere, and no backoff window reopens it (stopping)."""
        self.backoff.cancel()
        for sub in self.state.subs.values():
            sub.set_rdy(0)

    async def run(self) -> None:
        """Recompute RDY every ``rdy_redistribute_interval`` while a look may change it.

        Once it is settled, wait for a change instead: 1,000 idle consumers waking every 5 s
        to find nothing to do were half of their process's idle CPU.
        """
        while True:
            await anyio.sleep(self.state.options.rdy_redistribute_interval)
            if self.redistribute():
                self.wake = wake = anyio.Event()
                await wake.wait()
