"""SIGTERM and Ctrl-C on a consuming process: nothing may stay in flight in nsqd.

Each test writes a small worker script, runs it as a child process against a real nsqd and
sends it real signals. The worker's handler is slow and ``max_in_flight`` (6) is larger than
its ``concurrency`` (2), so at the signal some messages are being handled and others wait in
the client. Its ``msg_timeout`` is 60 s: a message left in flight by the worker would stay in
flight for a minute, so "0 in flight as soon as nsqd has seen the worker go" tells the
graceful stop apart from nsqd's timeout.

Without :func:`smartnsq.run` (the ``bare`` worker: ``anyio.run`` around ``async with
Consumer``) SIGTERM kills the process with its messages in flight and Ctrl-C prints a
traceback; the ``bare`` tests pin that down, so they show what the checks of the other tests
catch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import channel_stats, create_channel, unique, wait_for

pytestmark = [pytest.mark.reliability, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = 20
MAX_IN_FLIGHT = 6

WORKER = textwrap.dedent(
    """
    import logging
    import signal
    import sys

    import anyio

    import smartnsq

    # As if started from a terminal: a child of a background job (CI runs the suite as one)
    # inherits SIGINT ignored, and Python then never raises KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    mode, backend, nsqd, topic, channel = sys.argv[1:6]
    handler_seconds, stop_timeout = float(sys.argv[6]), float(sys.argv[7])
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    started = 0


    async def handle(message):
        global started
        started += 1
        print("start", message.body.decode(), flush=True)
        if started == 2:  # both workers busy; the rest of max_in_flight waits its turn
            print("busy", flush=True)
        await anyio.sleep(handler_seconds)
        print("done", message.body.decode(), flush=True)


    consumer = smartnsq.Consumer(
        topic,
        channel,
        handle,
        nsqd_tcp_addresses=[nsqd],
        max_in_flight=6,
        concurrency=2,
        msg_timeout=60,
    )
    options = {"use_uvloop": True} if backend == "uvloop" else {}
    backend = "asyncio" if backend == "uvloop" else backend
    if mode == "run":
        smartnsq.run(
            consumer, backend=backend, backend_options=options, stop_timeout=stop_timeout
        )
        s = consumer.stats()
        print(f"stats {s.received} {s.finished} {s.requeued} {s.in_flight}", flush=True)
    else:

        async def bare():
            async with consumer:
                await anyio.sleep_forever()

        anyio.run(bare, backend=backend, backend_options=options)
    """
)


class Worker:
    """A worker child process whose output lines are collected as they come."""

    def __init__(
        self, tmp_path: Path, mode: str, backend: str, *args: object, source: str = WORKER
    ) -> None:
        script = tmp_path / "worker.py"
        script.write_text(source)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, str(script), mode, backend, *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._collect, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._collect, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for t in self._readers:
            t.start()

    @staticmethod
    def _collect(stream: Any, lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    def wait_line(self, lines: list[str], text: str, timeout: float = 15.0) -> None:
        wait_for(
            lambda: any(text in line for line in lines) or self.proc.poll() is not None,
            timeout,
            f"worker to print {text!r}",
        )
        assert any(text in line for line in lines), f"worker exited early: {self.describe()}"

    def exit(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        for t in self._readers:
            t.join(5)
        return code

    def bodies(self, word: str) -> list[str]:
        return [line.split()[1] for line in self.out if line.startswith(word + " ")]

    def fields(self, word: str) -> list[str]:
        """The words after ``word`` on the line it starts."""
        found = [line.split()[1:] for line in self.out if line.startswith(word + " ")]
        assert len(found) == 1, f"expected one {word!r} line: {self.describe()}"
        return found[0]

    def describe(self) -> str:
        return f"stdout={self.out!r} stderr={self.err!r}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def publish(nsqd_http: str, topic: str, count: int) -> None:
    body = "\n".join(f"m{i:03d}" for i in range(count)).encode()
    req = urllib.request.Request(f"http://{nsqd_http}/mpub?topic={topic}", body, method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200


@pytest.fixture
def nsqd(classic_cluster: Any) -> Any:
    return classic_cluster.nsqd[0]


def start_busy_worker(
    tmp_path: Path, nsqd: Any, mode: str, backend: str, handler_seconds: float, stop_timeout: float
) -> tuple[Worker, str, str]:
    """A worker holding MAX_IN_FLIGHT messages in flight, two of them in its handler."""
    topic, ch = unique("signals"), "c"
    create_channel(nsqd.http, topic, ch)
    publish(nsqd.http, topic, PUBLISHED)
    worker = Worker(tmp_path, mode, backend, nsqd.tcp, topic, ch, handler_seconds, stop_timeout)
    worker.wait_line(worker.out, "busy")
    wait_for(
        lambda: (channel_stats(nsqd.http, topic, ch) or {}).get("in_flight_count") == MAX_IN_FLIGHT,
        10,
        f"{MAX_IN_FLIGHT} messages in flight",
    )
    return worker, topic, ch


def stats_once_gone(nsqd: Any, topic: str, ch: str) -> dict[str, Any]:
    """The channel's stats once nsqd has dropped the worker's connection.

    nsqd reads a connection's commands in order and drops the client at its end, so every
    FIN and REQ the worker sent is counted by then."""
    return wait_for(
        lambda: (s := channel_stats(nsqd.http, topic, ch)) is not None and not s["clients"] and s,
        5,
        "nsqd to drop the worker's connection",
    )


def nsqd_finished(s: dict[str, Any]) -> int:
    """Messages of the channel that nsqd counts as finished: each of the ``message_count``
    it took in is either back in ``depth``, deferred, in flight, or finished."""
    return int(s["message_count"] - s["depth"] - s["deferred_count"] - s["in_flight_count"])


BACKENDS = ["asyncio", "trio", "uvloop"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_signal_stops_gracefully(tmp_path, nsqd, backend, sig):
    """On the signal the running handlers finish, the waiting messages are requeued at once,
    and the process exits with status 0, no traceback and nothing in flight."""
    worker, topic, ch = start_busy_worker(tmp_path, nsqd, "run", backend, 2.0, 30.0)
    try:
        sent = time.monotonic()
        worker.proc.send_signal(sig)
        code = worker.exit(timeout=20)
        took = time.monotonic() - sent
    finally:
        worker.kill()
    assert code == 0, worker.describe()
    assert not any("Traceback" in line for line in worker.err), worker.describe()
    s = stats_once_gone(nsqd, topic, ch)
    assert s["in_flight_count"] == 0, s
    assert (s["message_count"], s["timeout_count"]) == (PUBLISHED, 0), s
    # Every handler that started finished (the stop waited for it) and was FINed.
    started, done = worker.bodies("start"), worker.bodies("done")
    assert started and sorted(started) == sorted(done), worker.describe()
    assert nsqd_finished(s) == len(done), s
    # Every message the worker received was finished or requeued, and nsqd agrees.
    received, finished, requeued, in_flight = map(int, worker.fields("stats"))
    assert (finished, in_flight) == (len(done), 0), worker.describe()
    assert finished + requeued == received, worker.describe()
    assert requeued >= 1, "messages waiting in the client at the signal must be requeued"
    assert s["requeue_count"] == requeued, s
    # Well before nsqd's 60 s msg_timeout: the handler time plus a little.
    assert took < 10, f"stop took {took:.1f}s"


@pytest.mark.parametrize("backend", BACKENDS)
def test_second_signal_stops_at_once(tmp_path, nsqd, backend):
    """A second signal during the stop cancels the running handlers (which would take 10
    minutes) instead of waiting stop_timeout (60 s): their messages are requeued at once."""
    worker, topic, ch = start_busy_worker(tmp_path, nsqd, "run", backend, 600.0, 60.0)
    try:
        sent = time.monotonic()
        worker.proc.send_signal(signal.SIGTERM)
        worker.wait_line(worker.err, "SIGTERM received: stopping")
        worker.proc.send_signal(signal.SIGINT)
        code = worker.exit(timeout=20)
        took = time.monotonic() - sent
    finally:
        worker.kill()
    assert code == 0, worker.describe()
    assert not any("Traceback" in line for line in worker.err), worker.describe()
    assert worker.bodies("start") and not worker.bodies("done"), worker.describe()
    received, finished, requeued, in_flight = map(int, worker.fields("stats"))
    assert (finished, in_flight, requeued) == (0, 0, received), worker.describe()
    s = stats_once_gone(nsqd, topic, ch)
    assert s["in_flight_count"] == 0, s
    assert (nsqd_finished(s), s["requeue_count"], s["timeout_count"]) == (0, received, 0), s
    assert took < 10, f"stop took {took:.1f}s"


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_bare_worker_leaves_messages_in_flight_on_sigterm(tmp_path, nsqd, backend):
    """Without smartnsq.run, SIGTERM kills the worker outright: the messages it held stay in
    flight in nsqd until their 60 s msg_timeout, though nsqd has dropped the connection."""
    worker, topic, ch = start_busy_worker(tmp_path, nsqd, "bare", backend, 2.0, 30.0)
    try:
        worker.proc.send_signal(signal.SIGTERM)
        code = worker.exit(timeout=20)
    finally:
        worker.kill()
    assert code == -signal.SIGTERM, worker.describe()
    s = stats_once_gone(nsqd, topic, ch)
    assert s["in_flight_count"] == MAX_IN_FLIGHT, s
    assert (nsqd_finished(s), s["requeue_count"]) == (0, 0), s


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_bare_worker_prints_traceback_on_ctrl_c(tmp_path, nsqd, backend):
    """Without smartnsq.run, Ctrl-C ends the worker with KeyboardInterrupt's traceback and a
    failure status. (Its messages do get answered: ``async with Consumer`` stops on the way
    out.)"""
    worker, _, _ = start_busy_worker(tmp_path, nsqd, "bare", backend, 2.0, 30.0)
    try:
        worker.proc.send_signal(signal.SIGINT)
        code = worker.exit(timeout=20)
    finally:
        worker.kill()
    assert code != 0, worker.describe()
    assert any("Traceback" in line for line in worker.err), worker.describe()
    assert any("KeyboardInterrupt" in line for line in worker.err), worker.describe()
