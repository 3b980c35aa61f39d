"""Pacing: how many messages each connection may hold (RDY), and backoff after failures.

The arithmetic is elsewhere (:mod:`smartnsq.consumer.rdy` spreads ``max_in_flight``,
:mod:`smartnsq.consumer.backoff` keeps the level and its windows); this drives them over the
subscriptions.
"""

from __future__ import annotations

import logging
import random
import time

import anyio

from smartnsq.consumer.backoff import RESUME, Backoff, Window
from smartnsq.consumer.rdy import distribute
from smartnsq.consumer.state import State
from smartnsq.consumer.subscription import Subscription

log = logging.getLogger("smartnsq.consumer")

PROBE_MOVE = 0.5  # seconds a backoff probe waits on a connection before it moves on


class Pacing:
    __slots__ = ("backoff", "enabled", "looking", "state")

    def __init__(self, state: State) -> None:
        self.state = state
        self.looking = False  # a task looks at RDY every interval (the share is uneven)
        options = state.options
        self.enabled = options.backoff
        self.backoff = Backoff(options.backoff_unit, options.max_backoff_duration)

    def result(self, success: bool) -> None:
        """Count one handler result (see smartnsq.consumer.backoff) and do what it asks."""
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

    def failed(self, redelivery: bool = False) -> None:
        """A handler failure that counts for backoff (when it is on, and not stopping).

        While backing off, a redelivered message failing again says nothing new: its first
        failure was counted. nsqd hands requeued messages out ahead of the backlog, so
        counting them made every probe fail and kept a consumer with a few bad messages at
        one message per window. The probe's RDY 1 stays: the next message decides."""
        if not self.enabled or self.state.stopping:
            return
        if redelivery and self.backoff.level and not self.backoff.blocked:
            return
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
            if not backoff.level:
                return  # resumed (RESUME redistributed)
            if not subs:
                # Nobody to ask until a connection is back: returning left the level up
                # with nothing to end it (a subscription's RDY waits for the backoff).
                await anyio.sleep(PROBE_MOVE)
                continue
            sub = subs[turn % len(subs)]
            turn += 1
            received = sub.received
            sub.set_rdy(1)
            await anyio.sleep(PROBE_MOVE)
            while sub.in_flight and sub.conn.usable and backoff.epoch == epoch and backoff.level:
                await anyio.sleep(PROBE_MOVE)  # still handled: its result may decide
            if backoff.epoch != epoch or not backoff.level or state.stopping:
                return  # a result decided
            if sub.received != received:
                # Answered without deciding (given up, or a redelivery failing again): the
                # probe goes on here. Returning left the backoff with nothing to end it.
                turn -= 1
                continue
            sub.set_rdy(0)

    def redistribute(self) -> bool:
        """Hand out ``max_in_flight`` again. True when there is nothing a later look could
        change before something else calls this (an even share, a backoff, no connection);
        else a task looks again every ``rdy_redistribute_interval`` until that is so."""
        settled = self._share()
        if not settled and not self.looking:
            self.looking = self.state.spawn(self._look)
        return settled

    async def _look(self) -> None:
        # Only while the share is uneven: a consumer whose share is settled (the usual
        # case) keeps no task for it. 1,000 idle consumers waking every 5 s to find nothing
        # to do were half of their process's idle CPU, and a task each held ~4 KB.
        try:
            while not self.state.stopping:
                await anyio.sleep(self.state.options.rdy_redistribute_interval)
                if self._share():
                    return
        finally:
            self.looking = False

    def _share(self) -> bool:
        state = self.state
        if state.stopping:
            return True
        subs = state.usable()
        if not subs:
            return True
        mif = state.max_in_flight
        if not mif:  # paused, with or without a backoff
            for s in subs:
                s.set_rdy(0)
            return True
        if self.backoff.level:
            return True  # the backoff window decides
        if all(s.ordered for s in subs):
            # One in flight per ordered partition whatever max_in_flight says: taking turns
            # held a partition with messages waiting until a turn came (5 s each).
            for s in subs:
                s.set_rdy(1)
            return True
        if _even(mif, subs):
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
        return _even(mif, subs)

    def pause(self) -> None:
        """RDY 0 everywhere, and no backoff window reopens it (stopping)."""
        self.backoff.cancel()
        for sub in self.state.subs.values():
            sub.set_rdy(0)


def _even(mif: int, subs: list[Subscription]) -> bool:
    """An even share with no remainder and no cap is in place: distribute() would hand every
    connection what it has, now and at every later look."""
    n = len(subs)
    if mif < n or mif % n:
        return False
    share = mif // n
    return all(s.rdy == share and s.max_rdy >= share for s in subs)
