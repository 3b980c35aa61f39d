"""Ctrl-C and SIGTERM on a process blocked in ``smartnsq.sync.Consumer(...).run()``.

As in tests/reliability/test_signals.py, a real child process runs against a real nsqd and
gets real signals. Its ``def`` handler sleeps for an hour, so only the stop's timeout or a
second signal can end it; ``msg_timeout`` is 60 s, so "nothing in flight as soon as nsqd
has seen the worker go" tells the graceful stop apart from nsqd's timeout.
"""

from __future__ import annotations

import signal
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import channel_stats, create_channel, unique, wait_for
from tests.reliability.test_signals import Worker, nsqd_finished, publish, stats_once_gone

pytestmark = [pytest.mark.reliability, pytest.mark.integration]

PUBLISHED = 5
RUNNING = 2  # handler threads: the other messages wait in the client

SYNC_WORKER = textwrap.dedent(
    """
    import logging
    import signal
    import sys
    import time

    from smartnsq.sync import Consumer

    # As if started from a terminal (a background job inherits SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    nsqd, topic, channel, stop_timeout = sys.argv[3:7]


    def handle(message):
        print("start", message.body.decode(), flush=True)
        time.sleep(3600)


    consumer = Consumer(
        topic, channel, handle, nsqd_tcp_addresses=[nsqd], max_in_flight=5, concurrency=2,
        msg_timeout=60,
    )
    if stop_timeout == "with":  # no run(): Ctrl-C raises KeyboardInterrupt in the block
        with consumer:
            time.sleep(3600)
    elif stop_timeout == "default":
        consumer.run()
    else:
        consumer.run(stop_timeout=float(stop_timeout))
    s = consumer.stats()
    print(f"stats {s.received} {s.finished} {s.requeued} {s.in_flight}", flush=True)
    """
)


@pytest.fixture
def nsqd(classic_cluster: Any) -> Any:
    return classic_cluster.nsqd[0]


def start_worker(tmp_path: Path, nsqd: Any, stop_timeout: str) -> tuple[Worker, str, str]:
    """A worker with all PUBLISHED messages in flight, RUNNING of them in its handler."""
    topic, ch = unique("syncsig"), "c"
    create_channel(nsqd.http, topic, ch)
    publish(nsqd.http, topic, PUBLISHED)
    worker = Worker(tmp_path, "sync", "-", nsqd.tcp, topic, ch, stop_timeout, source=SYNC_WORKER)
    wait_for(lambda: len(worker.bodies("start")) == RUNNING, 15, "both handlers to start")
    wait_for(
        lambda: (channel_stats(nsqd.http, topic, ch) or {}).get("in_flight_count") == PUBLISHED,
        10,
        f"{PUBLISHED} messages in flight",
    )
    return worker, topic, ch


def assert_all_requeued(worker: Worker, nsqd: Any, topic: str, ch: str, code: int) -> None:
    """Exit status 0, no traceback, and every message requeued: none left in flight."""
    assert code == 0, worker.describe()
    assert not any("Traceback" in line for line in worker.err), worker.describe()
    received, finished, requeued, in_flight = map(int, worker.fields("stats"))
    assert (received, finished, requeued, in_flight) == (PUBLISHED, 0, PUBLISHED, 0), (
        worker.describe()
    )
    s = stats_once_gone(nsqd, topic, ch)
    assert s["in_flight_count"] == 0, s
    assert (nsqd_finished(s), s["requeue_count"], s["timeout_count"]) == (0, PUBLISHED, 0), s


def test_second_ctrl_c_stops_at_once(tmp_path, nsqd):
    """The first Ctrl-C starts the stop (the waiting messages are requeued, the running
    handlers get the default 10 s); a second one cuts that wait: the process ends at once
    with the running handlers' messages requeued too."""
    worker, topic, ch = start_worker(tmp_path, nsqd, "default")
    try:
        worker.proc.send_signal(signal.SIGINT)
        # The stop has begun: the messages waiting in the client are back in nsqd.
        wait_for(
            lambda: (channel_stats(nsqd.http, topic, ch) or {}).get("in_flight_count") == RUNNING,
            10,
            "the waiting messages to be requeued",
        )
        sent = time.monotonic()
        worker.proc.send_signal(signal.SIGINT)
        code = worker.exit(timeout=20)
        took = time.monotonic() - sent
    finally:
        worker.kill()
    assert_all_requeued(worker, nsqd, topic, ch, code)
    assert took < 5, f"the second Ctrl-C took {took:.1f}s to end the process"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_run_stop_timeout_bounds_the_stop(tmp_path, nsqd, sig):
    """``run(stop_timeout=1)``: handlers that never return are given up after 1 s (not the
    default 10 s) and their messages requeued; the process ends."""
    worker, topic, ch = start_worker(tmp_path, nsqd, "1")
    try:
        sent = time.monotonic()
        worker.proc.send_signal(sig)
        code = worker.exit(timeout=20)
        took = time.monotonic() - sent
    finally:
        worker.kill()
    assert_all_requeued(worker, nsqd, topic, ch, code)
    assert 1 <= took < 6, f"the stop took {took:.1f}s"


def test_second_ctrl_c_during_close_stops_at_once(tmp_path, nsqd):
    """Without run(): the first Ctrl-C raises KeyboardInterrupt in the ``with`` block, whose
    exit waits for the running handlers (10 s); a second Ctrl-C cuts that wait instead of
    raising out of it with messages in flight. The first KeyboardInterrupt still ends the
    program (the caller's to handle)."""
    worker, topic, ch = start_worker(tmp_path, nsqd, "with")
    try:
        worker.proc.send_signal(signal.SIGINT)
        wait_for(
            lambda: (channel_stats(nsqd.http, topic, ch) or {}).get("in_flight_count") == RUNNING,
            10,
            "the waiting messages to be requeued",
        )
        sent = time.monotonic()
        worker.proc.send_signal(signal.SIGINT)
        code = worker.exit(timeout=20)
        took = time.monotonic() - sent
    finally:
        worker.kill()
    assert code != 0 and any("KeyboardInterrupt" in line for line in worker.err), worker.describe()
    s = stats_once_gone(nsqd, topic, ch)
    assert s["in_flight_count"] == 0, s
    assert (nsqd_finished(s), s["requeue_count"], s["timeout_count"]) == (0, PUBLISHED, 0), s
    assert took < 5, f"the second Ctrl-C took {took:.1f}s to end the process"
    assert any("received while stopping" in line for line in worker.err), worker.describe()
