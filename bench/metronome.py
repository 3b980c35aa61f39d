"""The latency benchmark's shared clock for pipe-fed publishers (``--feed pipe``).

It writes one byte to stdout for every message as it falls due (``W`` for warm-up, ``M``
for timed), so every publisher, whatever its language or event loop, is woken by the same
schedule through its own I/O path instead of by its runtime's timers (which differ: sub-ms
sleeps are rounded up to 1 ms by asyncio and Go's netpoller, and return at once on uvloop).
Arrivals are ``constant`` (message i at i/rate) or ``poisson`` (exponential gaps from a
fixed seed: the same schedule in every run at a rate). When done it closes stdout, and
writes its own lateness (how far behind the schedule its writes were) as JSON to ``--stats``.

    python -m bench.metronome --rate R --warmup W --seconds S [--arrivals poisson]
                              [--seed N] [--stats FILE]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import time
from array import array
from bisect import bisect_right
from itertools import accumulate

PR_SET_TIMERSLACK = 29


def schedule(rate: float, n: int, arrivals: str, seed: int) -> array[int]:
    """Due offsets in ns from the start, one per message."""
    if arrivals == "constant":
        return array("q", (int(i * 1e9 / rate) for i in range(n)))
    rnd = random.Random(seed)
    gaps = (rnd.expovariate(rate) * 1e9 for _ in range(n))
    return array("q", (int(t) for t in accumulate(gaps, initial=0.0)))[:n]


def run(due: array[int], n_warm: int, fd: int) -> array[int]:
    """Write each message's byte when it falls due; returns the lateness of every write."""
    late = array("q")
    t0 = time.monotonic_ns()
    i, n = 0, len(due)
    while i < n:
        now = time.monotonic_ns() - t0
        j = bisect_right(due, now, i)  # every message due by now
        if j == i:
            time.sleep((due[i] - now) / 1e9)
            continue
        late.append(now - due[i])
        warm = max(0, min(j, n_warm) - i)
        os.write(fd, b"W" * warm + b"M" * (j - i - warm))
        i = j
    return late


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.metronome", description=__doc__)
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--warmup", type=float, required=True)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--arrivals", choices=("constant", "poisson"), default="constant")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stats", default="")
    a = ap.parse_args(argv)
    n_warm = int(a.warmup * a.rate)
    due = schedule(a.rate, n_warm + int(a.seconds * a.rate), a.arrivals, a.seed)
    # Linux: the default 50 us timer slack would make every short sleep late by that much.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    late = run(due, n_warm, 1)
    os.close(1)
    if a.stats:
        s = sorted(late)
        with open(a.stats, "w") as f:
            json.dump(
                {
                    "writes": len(s),
                    "late_p50_ms": s[len(s) // 2] / 1e6,
                    "late_p99_ms": s[int(len(s) * 0.99)] / 1e6,
                    "late_max_ms": s[-1] / 1e6,
                },
                f,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
