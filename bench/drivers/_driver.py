"""Shared CLI and output helpers for the client drivers (stdlib only).

Every ``drv_<client>.py`` runs inside its client's own virtualenv and is
invoked as::

    drv_<client>.py WORKLOAD --addr HOST:PORT --topic T [--n N] [--batch B]
                    [--seconds S] [--tasks K] [--channel C] [--mif M] [--variant V]

WORKLOAD is one of
  pub         one PUB per round trip: each publish waits for nsqd's OK
  mpub        MPUB batches of --batch messages, one batch in flight
  concurrent  --tasks tasks calling publish() on one producer (pipelined)
  consume     consume --n pre-filled messages from --channel with max_in_flight
              --mif, FINing each one through the library's normal consumer API

Every publish run stops after --n messages or --seconds, whichever comes
first.  The driver connects, sends one untimed warm-up PUB, then times the
workload only and prints one line ``RESULT {json}`` with n (timed messages),
warmup, elapsed, rate and cpu (the process's CPU seconds during the workload).

``consume`` notes t_start just before it creates the library's consumer,
prints ``STARTED {json}`` once the consumer exists and ``HANDLED {json}``
(n, t_start, t_handled, cpu) from the handler of the --n-th message.  It then
keeps its event loop running, so the last FINs get flushed, until the runner
writes a line to its stdin (``exit_on_stdin``); the runner takes the end time
from nsqd's stats (channel depth 0, nothing in flight).  CLOCK_MONOTONIC is
system-wide, so the runner can compare its own ``time.monotonic()`` with
t_start.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

MSG = b"x" * 100
WORKLOADS = ("pub", "mpub", "concurrent", "consume")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("workload", choices=WORKLOADS)
    p.add_argument("--addr", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--batch", type=int, default=200)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--tasks", type=int, default=64)
    p.add_argument("--channel", default="bench")
    p.add_argument("--mif", type=int, default=2500, help="max_in_flight (consume)")
    p.add_argument("--variant", default="", help="driver-specific variant (consume)")
    a = p.parse_args(argv)
    host, port = a.addr.rsplit(":", 1)
    a.host, a.port = host, int(port)
    return a


_cpu0 = 0.0


def now() -> float:
    return time.monotonic()


def start() -> float:
    """Start the workload clock (wall and this process's CPU); returns t0."""
    global _cpu0
    _cpu0 = time.process_time()
    return time.monotonic()


def emit(n: int, warmup: int, t0: float, t1: float, error: str | None = None) -> None:
    elapsed = t1 - t0
    d = {
        "n": n,
        "warmup": warmup,
        "elapsed": elapsed,
        "rate": n / elapsed if elapsed > 0 else 0.0,
        "cpu": time.process_time() - _cpu0,  # client CPU seconds during the workload
        "error": error,
    }
    sys.stdout.write("RESULT " + json.dumps(d) + "\n")
    sys.stdout.flush()


def unsupported(workload: str) -> None:
    sys.stderr.write(f"workload {workload!r} is not supported by this driver\n")
    raise SystemExit(3)


def emit_started(t_start: float) -> None:
    sys.stdout.write("STARTED " + json.dumps({"t_start": t_start}) + "\n")
    sys.stdout.flush()


def emit_handled(n: int, t_start: float) -> None:
    """Called by the consume handler for the last message (counted, not yet FINed)."""
    t = time.monotonic()
    d = {"n": n, "t_start": t_start, "t_handled": t, "cpu": time.process_time() - _cpu0}
    sys.stdout.write("HANDLED " + json.dumps(d) + "\n")
    sys.stdout.flush()


def exit_on_stdin() -> None:
    """Hard-exit the process from a daemon thread once the runner writes a line
    to (or closes) stdin: stops every library the same way, whatever its loop."""

    def wait() -> None:
        try:
            sys.stdin.readline()
        finally:
            sys.stdout.flush()
            os._exit(0)

    threading.Thread(target=wait, daemon=True).start()
