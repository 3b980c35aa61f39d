from hypothesis import given
from hypothesis import strategies as st

from smartnsq.consumer.rdy import distribute

conn_states = st.lists(
    st.tuples(
        st.integers(0, 3000),  # current rdy
        st.integers(1, 2500),  # max rdy
        st.floats(0, 100),  # idle seconds
        st.floats(0, 100),  # seconds since rdy changed
    ),
    max_size=12,
)


def d(m, conns, idle=10.0, rotate=5.0):
    return distribute(m, conns, low_rdy_idle_timeout=idle, rotate_after=rotate)


@given(st.integers(0, 10_000), conn_states)
def test_invariants(max_in_flight, conns):
    targets = d(max_in_flight, conns)
    assert len(targets) == len(conns)
    assert sum(targets) <= max_in_flight
    assert all(0 <= t <= c[1] for t, c in zip(targets, conns, strict=True))
    # Nothing is lost: either every slot is handed out or every connection is at its cap.
    if max_in_flight >= len(conns):
        assert sum(targets) == min(max_in_flight, sum(c[1] for c in conns))
    elif conns:
        assert sum(targets) == max_in_flight


def test_even_split_hands_out_remainder_to_most_active():
    conns = [(0, 2500, 5.0, 0), (0, 2500, 0.1, 0), (0, 2500, 1.0, 0)]
    assert d(10, conns) == [3, 4, 3]


def test_capped_connection_leaves_capacity_to_others():
    conns = [(0, 2, 0, 0), (0, 2500, 0, 0)]
    assert d(10, conns) == [2, 8]


def test_zero_pauses():
    assert d(0, [(5, 2500, 0, 0)] * 3) == [0, 0, 0]


def test_rotation_gives_waiting_connection_a_turn():
    # max_in_flight 2, three nsqd: the holder that held longest (>= rotate_after) yields.
    conns = [(1, 2500, 0.0, 6.0), (1, 2500, 0.0, 1.0), (0, 2500, 0.0, 3.0)]
    assert d(2, conns) == [0, 1, 1]


def test_idle_holder_yields_first():
    conns = [(1, 2500, 0.0, 1.0), (1, 2500, 20.0, 1.0), (0, 2500, 0.0, 3.0)]
    assert d(2, conns) == [1, 0, 1]


def test_holders_keep_slots_when_nobody_waits_long():
    conns = [(1, 2500, 0.0, 1.0), (1, 2500, 0.0, 1.0), (0, 2500, 0.0, 0.5)]
    assert d(2, conns) == [1, 1, 0]


def test_every_connection_eventually_served():
    # Simulate ticks: each tick, time advances by rotate_after; all stay busy (idle 0).
    conns = [[0, 2500, 0.0, 0.0] for _ in range(3)]
    served = set()
    for _ in range(6):
        targets = d(2, [tuple(c) for c in conns])
        for i, t in enumerate(targets):
            if t:
                served.add(i)
            if t != conns[i][0]:
                conns[i][0] = t
                conns[i][3] = 0.0
        for c in conns:
            c[3] += 5.0
    assert served == {0, 1, 2}
