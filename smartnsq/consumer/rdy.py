"""How a consumer spreads ``max_in_flight`` over its connections (pure, no I/O).

Rules:

* the targets never sum above ``max_in_flight``, and never exceed a connection's
  ``max_rdy_count``;
* with at least as many slots as connections, each gets ``max_in_flight // n``; the
  remainder goes, one each, to the most recently active connections instead of being lost;
  capacity a capped connection cannot take goes to the others;
* with fewer slots than connections, at most ``max_in_flight`` connections hold RDY 1. A
  holder gives its slot up when it has been idle for ``low_rdy_idle_timeout``, or when it has
  held it for ``rotate_after`` while another connection waits; the connection that has waited
  longest gets it. So every nsqd is eventually drained.
"""

from __future__ import annotations

from collections.abc import Sequence

# Per connection: (current rdy, max rdy, seconds since its last message, seconds since its
# rdy last changed).
ConnState = tuple[int, int, float, float]


def distribute(
    max_in_flight: int,
    conns: Sequence[ConnState],
    *,
    low_rdy_idle_timeout: float,
    rotate_after: float,
) -> list[int]:
    n = len(conns)
    if n == 0:
        return []
    if max_in_flight <= 0:
        return [0] * n
    if max_in_flight >= n:
        return _share(max_in_flight, conns)
    return _rotate(max_in_flight, conns, low_rdy_idle_timeout, rotate_after)


def _share(max_in_flight: int, conns: Sequence[ConnState]) -> list[int]:
    n = len(conns)
    targets = [0] * n
    left = max_in_flight
    open_ = list(range(n))
    # Most recently active first: they get the remainder.
    open_.sort(key=lambda i: conns[i][2])
    while left > 0 and open_:
        base, extra = divmod(left, len(open_))
        still_open = []
        for rank, i in enumerate(open_):
            want = base + (1 if rank < extra else 0)
            room = conns[i][1] - targets[i]
            give = min(want, room)
            targets[i] += give
            left -= give
            if targets[i] < conns[i][1]:
                still_open.append(i)
        if len(still_open) == len(open_):
            break  # nobody was capped: everything handed out
        open_ = still_open
    return targets


def _rotate(
    max_in_flight: int, conns: Sequence[ConnState], idle_timeout: float, rotate_after: float
) -> list[int]:
    holders = [i for i, c in enumerate(conns) if c[0] > 0]
    waiting = [i for i, c in enumerate(conns) if c[0] == 0]
    waiting.sort(key=lambda i: -conns[i][3])  # longest waiting first
    keep: list[int] = []
    released = 0
    # Least recently active holders are the first to give up their slot, and only when a
    # waiting connection can take it.
    for i in sorted(holders, key=lambda i: -conns[i][2]):
        idle, held = conns[i][2], conns[i][3]
        if released < len(waiting) and (idle >= idle_timeout or held >= rotate_after):
            released += 1
            continue
        keep.append(i)
    keep = keep[:max_in_flight]
    chosen = set(keep) | set(waiting[: max_in_flight - len(keep)])
    return [1 if i in chosen else 0 for i in range(len(conns))]
