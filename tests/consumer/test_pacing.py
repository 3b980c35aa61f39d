"""Pacing's periodic redistribute (no sockets): an even share already in place is left alone
(it runs every few seconds for every consumer), anything else is still corrected."""

from __future__ import annotations

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
