"""The producer's own MPUB encoder matches the protocol core's."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from smartnsq.producer import _mpub
from smartnsq.protocol import commands


@given(st.lists(st.binary(min_size=1, max_size=50), min_size=1, max_size=30))
def test_mpub_matches_the_protocol_encoder(bodies: list[bytes]) -> None:
    sizes = [len(b) for b in bodies]
    uniform = len(set(sizes)) == 1
    assert _mpub("t", bodies, sizes, uniform) == commands.mpub("t", bodies)


@given(st.integers(min_value=1, max_value=40), st.integers(min_value=1, max_value=30))
def test_mpub_same_size_bodies(size: int, count: int) -> None:
    bodies = [bytes([i % 256]) * size for i in range(count)]
    assert _mpub("t", bodies, [size] * count, True) == commands.mpub("t", bodies)
