"""Shared parts of the latency drivers (stdlib only; run in every client's venv).

Every ``lat_<client>.py`` has two roles::

    lat_<client>.py pub --addr A --topic T --rate R --warmup W --seconds S [--variant V]
    lat_<client>.py sub --addr A --topic T --channel C --mif M --out FILE
                        [--obt-ms MS] [--variant V]

``pub`` is an open-loop publisher: message i is due at t0 + i/R; whenever it wakes up it
publishes every message due by then in one call (PUB for one, MPUB for more), each body
stamped with CLOCK_MONOTONIC (``time.monotonic_ns()``) taken right before that call, so a
slow consumer never slows it down. The first W*R messages are warm-up ('W' at byte 8), the
next S*R are timed ('M'). It prints ``RESULT {json}`` (n, warmup, elapsed, cpu for the timed
part, lag_max_ms: how far the publisher ever fell behind its schedule).

With ``--feed`` the publisher keeps no schedule: ``bench.metronome`` writes a byte to its
stdin as each message falls due, and it publishes, whenever it reads, one call for the
messages read (warm-up and timed ones in calls of their own), until end of file.

``sub`` subscribes (with ``--obt-ms`` as IDENTIFY's output_buffer_timeout when given), prints
``READY``, and records ``monotonic_ns() - stamp`` on handler entry for every timed message.
When the runner closes its stdin it writes the latencies (int64 ns, native order) to
``--out`` and prints ``RESULT {json}`` (n, cpu from the first timed message on).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import threading
import time
from array import array

PAD = b"x" * 91
WARM, TIMED = ord("W"), ord("M")
MAX_CALL = 10_000


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=("pub", "sub"))
    p.add_argument("--addr", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--channel", default="lat")
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--mif", type=int, default=2500)
    p.add_argument("--obt-ms", type=int, default=0, help="0: nsqd's default")
    p.add_argument("--out", default="")
    p.add_argument("--variant", default="")
    p.add_argument("--feed", action="store_true", help="paced by bytes on stdin")
    return p.parse_args()


def emit(kind: str, data: dict[str, object]) -> None:
    sys.stdout.write(f"{kind} {json.dumps(data)}\n")
    sys.stdout.flush()


class Pacer:
    """The open-loop schedule: ``step()`` returns the bodies due now, or the seconds to wait
    for the next one, or None when every message is out."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.n_warm = int(a.warmup * a.rate)
        self.total = self.n_warm + int(a.seconds * a.rate)
        self.period: float = 1e9 / a.rate
        self.i = 0
        self.batches = 0
        self.lag_max = 0
        self.cpu0 = 0.0
        self.t_timed = 0
        self.t0 = time.monotonic_ns()

    def step(self) -> list[bytes] | float | None:
        i = self.i
        if i >= self.total:
            return None
        now = time.monotonic_ns()
        due = min(self.total, int((now - self.t0) / self.period) + 1)
        if due <= i:
            return (self.t0 + i * self.period - now) / 1e9
        timed = i >= self.n_warm
        if not timed:
            due = min(due, self.n_warm)  # the timed part starts with a batch of its own
        else:
            self.lag_max = max(self.lag_max, now - int(self.t0 + i * self.period))
            if i == self.n_warm:
                self.cpu0 = time.process_time()
                self.t_timed = now
        body = struct.pack(">QB", now, TIMED if timed else WARM) + PAD
        self.i = due
        self.batches += 1
        return [body] * (due - i)

    def result(self, error: str | None = None) -> None:
        emit(
            "RESULT",
            {
                "n": self.i - self.n_warm,
                "warmup": self.n_warm,
                "elapsed": (time.monotonic_ns() - self.t_timed) / 1e9,
                "cpu": time.process_time() - self.cpu0,
                "lag_max_ms": self.lag_max / 1e6,
                "batches": self.batches,
                "error": error,
            },
        )


class Feed:
    """The pipe-fed publisher's bookkeeping: ``add()`` what was read from stdin, then
    ``call()`` gives the bodies of the next publish call (stamped now), or None when nothing
    is waiting. One call holds messages of one kind, so the timed part starts with a call of
    its own."""

    def __init__(self) -> None:
        self.waiting = b""
        self.n = 0
        self.n_warm = 0
        self.batches = 0
        self.cpu0 = 0.0
        self.t_timed = 0

    def add(self, chunk: bytes) -> None:
        self.waiting += chunk

    def call(self) -> list[bytes] | None:
        w = self.waiting
        if not w:
            return None
        # A publisher that fell far behind sends what waits in calls of at most MAX_CALL
        # (one MPUB must stay under nsqd's 5 MB --max-body-size).
        k = min(len(w) - len(w.lstrip(w[:1])), MAX_CALL)
        self.waiting = w[k:]
        now = time.monotonic_ns()
        if w[0] == TIMED:
            if not self.n:
                self.cpu0 = time.process_time()
                self.t_timed = now
            self.n += k
        else:
            self.n_warm += k
        self.batches += 1
        return [struct.pack(">QB", now, w[0]) + PAD] * k

    def result(self, error: str | None = None) -> None:
        emit(
            "RESULT",
            {
                "n": self.n,
                "warmup": self.n_warm,
                "elapsed": (time.monotonic_ns() - self.t_timed) / 1e9,
                "cpu": time.process_time() - self.cpu0,
                "lag_max_ms": None,
                "batches": self.batches,
                "error": error,
            },
        )


class Recorder:
    """Latency of every timed message, taken on handler entry."""

    def __init__(self, out: str) -> None:
        self.lat = array("q")
        self.out = out
        self.cpu0 = 0.0
        self._lock = threading.Lock()

    def record(self, body: bytes) -> None:
        t = time.monotonic_ns()
        if body[8] == TIMED:
            if not self.lat:
                self.cpu0 = time.process_time()
            self.lat.append(t - int.from_bytes(body[:8], "big"))

    def ready(self) -> None:
        """Print READY and finish (write the file, RESULT, exit) when stdin closes."""

        def wait() -> None:
            try:
                sys.stdin.read()
            finally:
                cpu = time.process_time() - self.cpu0
                lat = array("q", self.lat)  # a copy: the loop may still be appending
                with open(self.out, "wb") as f:
                    lat.tofile(f)
                emit("RESULT", {"n": len(lat), "cpu": cpu})
                os._exit(0)

        threading.Thread(target=wait, daemon=True).start()
        emit("READY", {})
