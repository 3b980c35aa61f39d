"""Keyed publishing and its book, for the Youzan HA fault cases.

Each of the publishers owns ``KEYS_PER_TASK`` sharding keys and numbers each key's bodies
``key|0``, ``key|1``, ... in order; a failed publish is sent again later with the same
number (its outcome may be unknown, so that can leave a duplicate, never a gap). The
ordered consumer's handler books what it handled, so order violations and duplicates can
be counted afterwards. Thread-safe: blocking publishers and sync handlers run in threads.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, defaultdict
from typing import Any

from smartnsq import Message
from smartnsq.errors import NSQError

KEYS_PER_TASK = 4


class Book:
    """Acknowledged, raised and handled, per key (a ``harness.Workload``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: dict[tuple[str, int], float] = {}
        self.ack_times: dict[str, list[float]] = defaultdict(list)
        self.errors: list[BaseException] = []
        self.handled: list[tuple[str, int, int | None]] = []  # (key, seq, partition)
        self.seen: Counter[tuple[str, int]] = Counter()
        self._next_seq: Counter[str] = Counter()  # key -> number of its next body
        self._turn: Counter[int] = Counter()  # publisher -> publishes started

    # ---- the workload

    def next_publish(self, task: int) -> tuple[bytes, dict[str, Any]]:
        # Only publisher ``task`` touches its keys: no lock needed for the numbering.
        key = f"k{task}-{self._turn[task] % KEYS_PER_TASK}"
        self._turn[task] += 1
        return f"{key}|{self._next_seq[key]}".encode(), {"sharding_key": key}

    def ack(self, body: bytes) -> None:
        key, seq = _parse(body)
        now = time.monotonic()
        with self.lock:
            self.acked[(key, seq)] = now
            self.ack_times[key].append(now)
        self._next_seq[key] = seq + 1

    def error(self, exc: BaseException) -> None:
        with self.lock:
            self.errors.append(exc)

    def handle(self, message: Message) -> None:
        key, seq = _parse(message.body)
        with self.lock:
            self.handled.append((key, seq, message.partition))
            self.seen[(key, seq)] += 1

    # ---- questions

    def partitions_handled(self) -> int:
        with self.lock:
            return len({p for _, _, p in self.handled})

    def handled_count(self) -> int:
        with self.lock:
            return len(self.handled)

    def lost(self) -> list[tuple[str, int]]:
        with self.lock:
            return sorted(k for k in self.acked if k not in self.seen)

    def duplicates(self) -> int:
        with self.lock:
            return sum(n - 1 for n in self.seen.values() if n > 1)

    def order_violations(self) -> list[tuple[str, int, int]]:
        """(key, seq, highest before) for each message handled after a later one of its
        key; handling the latest one again is a duplicate, not a violation."""
        highest: dict[str, int] = {}
        out = []
        with self.lock:
            handled = list(self.handled)
        for key, seq, _ in handled:
            top = highest.get(key, -1)
            if seq < top:
                out.append((key, seq, top))
            highest[key] = max(top, seq)
        return out

    def recovered_after(self, t: float) -> float:
        """Seconds from ``t`` until every key had an acknowledged publish again."""
        firsts = []
        with self.lock:
            for times in self.ack_times.values():
                after = [x for x in times if x >= t]
                firsts.append(after[0] - t if after else math.inf)
        return max(firsts, default=math.inf)

    def foreign_errors(self) -> list[BaseException]:
        with self.lock:
            return [e for e in self.errors if not isinstance(e, NSQError)]

    def error_kinds(self) -> list[str]:
        with self.lock:
            return sorted({type(e).__name__ for e in self.errors})

    def summary(self) -> str:
        with self.lock:
            return (
                f"acked={len(self.acked)} handled={len(self.handled)} "
                f"errors={dict(Counter(type(e).__name__ for e in self.errors))}"
            )


def _parse(body: bytes) -> tuple[str, int]:
    key, seq = body.decode().split("|")
    return key, int(seq)
