"""Pacing's periodic redistribute (no sockets): an even share already in place is left alone
(it runs every few seconds for every consumer), anything else is still corrected."""

from __future__ import annotations

import trio
import trio.testing

from smartnsq.consumer.pacing import Pacing
from tests.consumer.test_parts import Parts


def test_an_even_share_in_place_is_kept_and_a_changed_one_restored() -> None:
    p = Parts(max_in_flight=10)
    (s1, c1), (s2, c2) = p.subscribe("n1:4150"), p.subscribe("n2:4150")
    p.pacing.redistribute()
    assert (s1.rdy, s2.rdy) == (5, 5)
    sent = len(c1.queued) + len(c1.written) + len(c2.queued) + len(c2.written)
    p.pacing.redistribute()
    assert len(c1.queued) + len(c1.written) + len(c2.queued) + len(c2.written) == sent
    s2.set_rdy(0)
    p.pacing.redistribute()
    assert (s1.rdy, s2.rdy) == (5, 5)
    p.state.max_in_flight = 11  # a remainder: the most recently active gets it
    p.pacing.redistribute()
    assert sorted((s1.rdy, s2.rdy)) == [5, 6]
    s1.max_rdy = 2  # capped: the other takes the rest
    p.state.max_in_flight = 10
    p.pacing.redistribute()
    assert (s1.rdy, s2.rdy) == (2, 8)


class CountingPacing(Pacing):
    """Pacing that counts its looks at RDY."""

    looks = 0

    def redistribute(self) -> bool:
        self.looks += 1
        return super().redistribute()


def test_a_settled_share_waits_for_a_change_instead_of_waking_every_interval() -> None:
    # Trio's mock clock jumps over sleeps: a simulated hour takes no real time.
    p = Parts(max_in_flight=10, rdy_redistribute_interval=5.0)
    pacing = p.pacing = CountingPacing(p.state)
    (s1, _), (s2, _) = p.subscribe("n1:4150"), p.subscribe("n2:4150")
    checks: dict[str, object] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pacing.run)
            await trio.sleep(3600)
            checks["settled"] = (pacing.looks, s1.rdy, s2.rdy)
            p.state.max_in_flight = 11  # an uneven share: RDY moves with time again
            pacing.redistribute()
            before = pacing.looks
            await trio.sleep(62.5)  # off the 5 s grid: no tie between two wake-ups
            checks["uneven"] = pacing.looks - before
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert checks["settled"] == (2, 5, 5)  # one look set the even share, one found it settled
    assert checks["uneven"] == 12  # every 5 s while the share is uneven (5 ... 60 s)
