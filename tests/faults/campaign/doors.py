"""The front doors of a flow: sources that publish numbered bodies to its topic, sinks that
take them out (handled in process, written to a file, copied, printed). Each books what it
was told was acknowledged and what came out, in the flow's :class:`Book`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio

import smartnsq
import smartnsq.sync
from smartnsq import Message
from smartnsq.errors import NSQError
from tests.faults.campaign.schedule import Flow
from tests.faults.harness import Settings

CHANNEL = "ch"
CHECK = "check"  # the checker's channel on a copy or dead-letter topic
PUBLISHERS = 4  # tasks or threads of an in-process source
ROOT = Path(__file__).resolve().parents[3]


# The "oversize" fault: the last nsqd runs with --max-msg-size=SMALL_MAX_MSG_SIZE, and a flow's
# source makes every 3rd body BIG bytes long for the fault's hold; the other nsqd take them.
SMALL_MAX_MSG_SIZE = 512
BIG = 600

# The exit status of a command stopped by a signal (docs/cli.md).
SIGNALLED = {"SIGINT": 130, "SIGTERM": 143}


@dataclass
class Book:
    """A flow's acknowledged and handled bodies; thread-safe."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    # body -> when its publish began (an answer can reach the client after its nsqd died)
    acked: dict[bytes, float] = field(default_factory=dict)
    handled: Counter[bytes] = field(default_factory=Counter)
    first_handled: dict[bytes, float] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)
    failed_publishes: int = 0
    given_up: dict[bytes, str] = field(default_factory=dict)  # body -> why (on_giving_up)

    def ack(self, body: bytes, when: float | None = None) -> None:
        with self.lock:
            self.acked.setdefault(body, time.monotonic() if when is None else when)

    def error(self, exc: BaseException) -> None:
        with self.lock:
            self.errors.append(exc)
            self.failed_publishes += 1

    def handle(self, body: bytes) -> None:
        with self.lock:
            self.handled[body] += 1
            self.first_handled.setdefault(body, time.monotonic())

    def set_handled(self, bodies: Counter[bytes]) -> None:
        """A sink that reports at the end (files, printed lines): replaces what it said."""
        with self.lock:
            now = time.monotonic()
            for b in bodies:
                self.first_handled.setdefault(b, now)
            self.handled = Counter(bodies)

    def give_up(self, body: bytes, reason: str) -> None:
        with self.lock:
            self.given_up.setdefault(body, reason)

    def missing(self) -> set[bytes]:
        """Acknowledged, neither handled nor given up (a consumer's on_giving_up)."""
        with self.lock:
            return {b for b in self.acked if b not in self.handled and b not in self.given_up}

    def duplicates(self) -> int:
        with self.lock:
            return sum(n - 1 for n in self.handled.values() if n > 1)

    def unacked_handled(self) -> int:
        with self.lock:
            return sum(1 for b in self.handled if b not in self.acked)


class Door:
    """A front door; subclasses that are processes override :meth:`signal` and :meth:`restart`."""

    name = ""
    process = False

    def start(self) -> None: ...
    def stop(self) -> None: ...

    def signal(self, sig: int) -> None:
        raise NotImplementedError

    def restart(self) -> None:
        raise NotImplementedError

    def collect(self) -> None:
        """Book what a sink that reports at the end (a file, printed lines) put out."""

    def problems(self) -> list[str]:
        """What the door itself said that is not true or not allowed (exit statuses,
        summaries, exceptions that are not ``smartnsq.errors`` types)."""
        return []


def body_of(flow: Flow, who: str, n: int, big: bool = False) -> bytes:
    body = b"f%d:%s:%d" % (flow.index, who.encode(), n)
    return body + b":" + b"x" * (BIG - len(body) - 1) if big else body


def is_big(body: bytes) -> bool:
    return len(body) >= BIG


def producer_addresses(nsqd: list[str], lookupd: list[str] | None) -> dict[str, list[str]]:
    """Where a source publishes: through ``lookupd`` when given (the fork: a partitioned
    topic's partitions and leaders come from the lookupds), else to ``nsqd``."""
    return {"lookupd_http_addresses": lookupd} if lookupd else {"nsqd_tcp_addresses": nsqd}


# ---------------------------------------------------------------- sources


class AsyncSource(Door):
    """``smartnsq.Producer`` shared by 4 tasks, on an event loop in a thread."""

    name = "async-producer"

    def __init__(
        self,
        flow: Flow,
        book: Book,
        nsqd: list[str],
        settings: Settings,
        lookupd: list[str] | None = None,
    ) -> None:
        self.flow, self.book, self.settings = flow, book, settings
        self.addresses = producer_addresses(nsqd, lookupd)
        self.publishing = threading.Event()
        self.oversize = threading.Event()  # set while an "oversize" fault holds
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.publishing.set()
        self.thread = threading.Thread(target=lambda: anyio.run(self._main), daemon=True)
        self.thread.start()

    async def _main(self) -> None:
        pace = PUBLISHERS / self.flow.rate
        kwargs = self.settings.producer_kwargs()

        async def publisher(producer: smartnsq.Producer, task: int) -> None:
            n = 0
            while self.publishing.is_set():
                body = body_of(self.flow, f"a{task}", n, self.oversize.is_set() and n % 3 == 0)
                n += 1
                began = time.monotonic()
                try:
                    await producer.publish(self.flow.topic, body)
                except Exception as exc:  # checked: every one an NSQError
                    self.book.error(exc)
                else:
                    self.book.ack(body, began)
                await anyio.sleep(pace)

        async with (
            smartnsq.Producer(**self.addresses, **kwargs) as producer,
            anyio.create_task_group() as tg,
        ):
            for task in range(PUBLISHERS):
                tg.start_soon(publisher, producer, task)

    def stop(self) -> None:
        self.publishing.clear()
        if self.thread is not None:
            self.thread.join(60)
            if self.thread.is_alive():
                self.book.error(RuntimeError("an async publisher did not stop within 60 s"))

    def problems(self) -> list[str]:
        return _foreign(self.book)


class BlockingSource(Door):
    """``smartnsq.sync.Producer`` shared by 4 threads."""

    name = "blocking-producer"

    def __init__(
        self,
        flow: Flow,
        book: Book,
        nsqd: list[str],
        settings: Settings,
        lookupd: list[str] | None = None,
    ) -> None:
        self.flow, self.book = flow, book
        self.producer = smartnsq.sync.Producer(
            **producer_addresses(nsqd, lookupd), **settings.producer_kwargs()
        )
        self.publishing = threading.Event()
        self.oversize = threading.Event()  # set while an "oversize" fault holds
        self.threads: list[threading.Thread] = []

    def _publisher(self, task: int) -> None:
        pace, n = PUBLISHERS / self.flow.rate, 0
        while self.publishing.is_set():
            body = body_of(self.flow, f"b{task}", n, self.oversize.is_set() and n % 3 == 0)
            n += 1
            began = time.monotonic()
            try:
                self.producer.publish(self.flow.topic, body)
            except Exception as exc:
                self.book.error(exc)
            else:
                self.book.ack(body, began)
            time.sleep(pace)  # pacing, not synchronisation

    def start(self) -> None:
        self.producer.__enter__()
        self.publishing.set()
        for task in range(PUBLISHERS):
            t = threading.Thread(target=self._publisher, args=(task,), daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self) -> None:
        self.publishing.clear()
        for t in self.threads:
            t.join(60)
            if t.is_alive():
                self.book.error(RuntimeError("a blocking publisher did not stop within 60 s"))
        self.producer.close()

    def problems(self) -> list[str]:
        return _foreign(self.book)


def _foreign(book: Book) -> list[str]:
    with book.lock:
        foreign = [e for e in book.errors if not isinstance(e, NSQError)]
    if not foreign:
        return []
    return [f"raised {len(foreign)} errors that are not smartnsq.errors types: {foreign[:3]!r}"]


class Proc:
    """A ``smartnsq`` command (or a script) run as a process of its own, output in files."""

    def __init__(self, argv: list[str], logs: Path, tag: str) -> None:
        self.argv, self.logs, self.tag = argv, logs, tag
        self.runs: list[tuple[list[str], int | None, str, str]] = []  # argv, status, how, out
        self.popen: subprocess.Popen[bytes] | None = None
        self.how = "ran to its end"
        self._n = 0

    def start(self, extra: list[str] = ()) -> None:  # type: ignore[assignment]
        argv = [*self.argv, *extra]
        self._n += 1
        out = self.logs / f"{self.tag}.{self._n}.out"
        err = self.logs / f"{self.tag}.{self._n}.err"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        with open(out, "wb") as o, open(err, "wb") as e:
            self.popen = subprocess.Popen(
                argv, stdout=o, stderr=e, stdin=subprocess.DEVNULL, env=env, cwd=self.logs
            )
        self.how = "ran to its end"
        self.runs.append((argv, None, self.how, str(out)))

    def signal(self, sig: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.how = signal.Signals(sig).name
            self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        if self.popen is None:
            return None
        try:
            status = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)
            status = None  # did not stop in time
        argv, _, _, out = self.runs[-1]
        self.runs[-1] = (argv, status, self.how, out)
        self.popen = None
        return status

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def outputs(self) -> list[str]:
        return [r[3] for r in self.runs]

    def stderr_problems(self) -> list[str]:
        out = []
        for _, _, _, path in self.runs:
            err = Path(path[: -len(".out")] + ".err")
            text = err.read_text(errors="replace") if err.exists() else ""
            if "Traceback" in text:
                out.append(f"{err.name}: a traceback on stderr (not a smartnsq.errors line)")
        return out


def smartnsq_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "smartnsq", *args]


# The command-line sinks get the in-process consumers' settings (run.consumer_kwargs): a
# lost connection noticed within seconds, its messages back after 3 s (the defaults: 60 s),
# a requeued message back within a second (the default: 90 s).
CLI_CONSUMER = [
    f"--consumer-opt={name}={value}"
    for name, value in (
        ("heartbeat_interval", "1s"), ("msg_timeout", "3"), ("reconnect_max", "1s"),
        ("lookupd_poll_interval", "1s"), ("requeue_delay", "0.2"), ("max_requeue_delay", "1"),
        ("max_backoff_duration", "1"), ("backoff_unit", "0.1"),
    )
]  # fmt: skip


class PubSource(Door):
    """``smartnsq pub --json --rate R`` of a file of numbered lines; after a signal, started
    again with the ``--resume-from`` it reported (or from the start when it had none)."""

    name = "pub"
    process = True

    def __init__(
        self,
        flow: Flow,
        book: Book,
        nsqd: list[str],
        logs: Path,
        seconds: float,
        oversize: Sequence[tuple[float, float]] = (),
        lookupd: list[str] | None = None,
    ):
        self.flow, self.book = flow, book
        self.lines = max(1, int(flow.rate * seconds))
        self.file = logs / f"flow{flow.index}.pub.txt"
        # Line n goes out about n / rate seconds in: big within an "oversize" fault's hold.
        self.bodies = [
            body_of(flow, "p", n, n % 3 == 0 and any(a <= n / flow.rate < b for a, b in oversize))
            for n in range(self.lines)
        ]
        self.file.write_bytes(b"".join(b + b"\n" for b in self.bodies))
        argv = smartnsq_cli(
            "pub", *(["--lookupd", ",".join(lookupd)] if lookupd else ["--nsqd", ",".join(nsqd)]),
            flow.topic, str(self.file), "--json",
            "--rate", str(flow.rate), "--producer-opt", "timeout=2s",
        )  # fmt: skip
        self.proc = Proc(argv, logs, f"flow{flow.index}.pub")
        # exit status, what stopped it, its --json summary, lines it says it acknowledged
        # (done: every line was answered, so the count is final; else up to its position)
        self.reports: list[tuple[int | None, str, dict[str, Any], int, bool]] = []
        self.resume: str | None = None
        self.done = False
        self.started = 0.0

    def start(self) -> None:
        self.started = time.monotonic()
        self.proc.start(["--resume-from", self.resume] if self.resume else [])

    def signal(self, sig: int) -> None:
        if self.proc.running():
            self.proc.signal(sig)
            self._finish(30)

    def restart(self) -> None:
        if not self.done:
            self.start()

    def stop(self) -> None:
        """Wait for the file to be published (it is sized for the publishing window)."""
        if self.proc.popen is not None:
            self._finish(self.lines / self.flow.rate + 60)

    def _finish(self, timeout: float) -> None:
        how = self.proc.how
        status = self.proc.wait(timeout)
        out = Path(self.proc.outputs()[-1])
        objs = [json.loads(x) for x in out.read_text().splitlines() if x.startswith("{")]
        summary = next((o for o in objs if "published" in o), {})
        failures = [o for o in objs if "error" in o and "lines" in o]
        first = int(self.resume) if self.resume else 0
        failed = {n for f in failures for n in _lines(str(f["lines"]))}
        if status == 0 or (
            status == 1 and not summary.get("interrupted") and not summary.get("gave_up")
        ):
            last = self.lines  # every line was answered: acknowledged or failed
            self.done = True
        else:
            position = summary.get("position")
            last = int(str(position).rpartition(":")[2]) if position else first
            if summary.get("resume_from"):
                self.resume = str(summary["resume_from"])
        done = self.done and last == self.lines
        answered = range(first + 1, last + 1)
        acked = len(answered) - len(failed.intersection(answered)) if done else last - first
        self.reports.append((status, how, summary, acked, done))
        # Lines are numbered from 1; body n is on line n + 1. pub does not say when each
        # line was acknowledged: the run's start is the earliest it can have been.
        for line in range(first + 1, last + 1):
            if line not in failed:
                self.book.ack(self.bodies[line - 1], self.started)
        if status not in (0, None) and not summary:
            self.book.errors.append(RuntimeError(f"pub exited {status} without a summary"))

    def problems(self) -> list[str]:
        out = self.proc.stderr_problems()
        for status, how, summary, claimed, done in self.reports:
            if summary and not summary.get("failed"):
                # a run that answered every line: what it acknowledged (lines sent without an
                # answer are neither); else every line up to its position and the later ones
                # it says it published
                beyond = 0 if done else int(summary.get("published_after_position") or 0)
                told = claimed + beyond
                if status != 0 and summary.get("published") != told:
                    out.append(f"pub says published {summary.get('published')}, not {told}")
                if status == 0 and summary.get("published") != claimed:
                    out.append(
                        f"pub exited 0 having published {summary.get('published')} "
                        f"of {claimed} lines"
                    )
            if status is None:
                out.append(f"pub did not exit after {how}")
                continue
            interrupted = bool(summary.get("interrupted"))
            if how in SIGNALLED and status not in (SIGNALLED[how], 1) and not self.done:
                out.append(f"pub exited {status} after {how} (expected {SIGNALLED[how]})")
            if how == "ran to its end" and interrupted:
                out.append(f"pub reported interrupted without a signal (exit {status})")
            if status == 0 and (summary.get("failed") or summary.get("unconfirmed")):
                out.append(f"pub exited 0 with failures: {summary}")
            if (
                status not in (0, None)
                and not (
                    summary.get("failed") or summary.get("unconfirmed") or summary.get("gave_up")
                )
                and not interrupted
            ):
                out.append(f"pub exited {status} but its summary has no failure: {summary}")
        return out


def _lines(ranges: str) -> list[int]:
    """``"3,5-7"`` -> ``[3, 5, 6, 7]`` (how pub --json names failed lines)."""
    out: list[int] = []
    for part in ranges.split(","):
        first, _, last = part.strip().partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return out


# ---------------------------------------------------------------- sinks


def _stable(body: bytes) -> float:
    """A number in [0, 1) that depends on the body only (not on PYTHONHASHSEED)."""
    h = 0
    for c in body:
        h = (h * 131 + c) % 1_000_003
    return h / 1_000_003


class Failing(Protocol):
    failure: BaseException | None


def loop_thread(main: Callable[[], Awaitable[None]], door: Failing) -> threading.Thread:
    """Run ``main`` on an event loop in a thread of its own; what it raises is the door's."""

    def run() -> None:
        try:
            anyio.run(main)
        except BaseException as exc:
            door.failure = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


class ConsumerSink(Door):
    """``smartnsq.Consumer`` (async handler) or ``smartnsq.sync.Consumer`` (def handler);
    a share of bodies fail their first attempt, every 7th is slow."""

    def __init__(
        self, flow: Flow, book: Book, lookupd: list[str], options: dict[str, Any], blocking: bool
    ) -> None:
        self.flow, self.book, self.lookupd, self.options = flow, book, lookupd, options
        self.blocking = blocking
        self.topic, self.channel = flow.topic, CHANNEL
        self.name = "blocking-consumer" if blocking else "async-consumer"
        self.stats: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Any = None
        self.failure: BaseException | None = None

    def _slow(self, body: bytes) -> float:
        """Seconds the handler takes for ``body``: every 7th or so is slow."""
        return self.flow.slow_ms / 1000 if _stable(body) < 1 / 7 else 0.0

    def _fails(self, message: Message) -> bool:
        """A share of bodies fail their first attempt (and are requeued)."""
        return message.attempts == 1 and _stable(message.body[::-1]) < self.flow.failing

    def start(self) -> None:
        kwargs = {"lookupd_http_addresses": self.lookupd, **self.options}
        if self.blocking:

            def handle(message: Message) -> None:
                time.sleep(self._slow(message.body))  # a slow handler, not synchronisation
                if self._fails(message):
                    raise RuntimeError("a failing handler (campaign)")
                self.book.handle(message.body)

            self._consumer = smartnsq.sync.Consumer(self.topic, self.channel, handle, **kwargs)
            self._consumer.start()
            return

        async def ahandle(message: Message) -> None:
            await anyio.sleep(self._slow(message.body))
            if self._fails(message):
                raise RuntimeError("a failing handler (campaign)")
            self.book.handle(message.body)

        async def main() -> None:
            async with smartnsq.Consumer(self.topic, self.channel, ahandle, **kwargs) as c:
                self._consumer = c
                while not self._stop.is_set():
                    await anyio.sleep(0.05)
                self.stats = c.stats()
            self.stats = c.stats()

        self._thread = loop_thread(main, self)

    def stop(self) -> None:
        if self.blocking:
            if self._consumer is not None:
                self._consumer.close()
                self.stats = self._consumer.stats()
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def problems(self) -> list[str]:
        out = []
        if self.failure is not None:
            out.append(f"the consumer raised {self.failure!r}")
        if self._thread is not None and self._thread.is_alive():
            out.append("the async consumer did not stop within 60 s")
        if self.stats is not None and getattr(self.stats, "in_flight", 0):
            out.append(f"stats() says {self.stats.in_flight} in flight after the stop")
        return out


class DeadLetterSink(Door):
    """An async consumer with ``max_attempts=2`` and ``dead_letter_topic``: a share of bodies
    always fail and go to ``TOPIC.dead``, read back by a checker consumer. Both count as
    handled."""

    name = "dead-letters"

    def __init__(self, flow: Flow, book: Book, lookupd: list[str], options: dict[str, Any]) -> None:
        self.flow, self.book, self.lookupd, self.options = flow, book, lookupd, options
        self.dead_book = Book()
        self.stats: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failure: BaseException | None = None

    @property
    def dead_topic(self) -> str:
        return f"{self.flow.topic}.dead"

    def start(self) -> None:
        kwargs = {"lookupd_http_addresses": self.lookupd, **self.options}
        share = max(0.05, self.flow.failing)

        async def handle(message: Message) -> None:
            if _stable(message.body[::-1]) < share:
                raise RuntimeError("a handler that always fails (campaign)")
            self.book.handle(message.body)

        async def check(message: Message) -> None:
            self.book.handle(message.body)
            self.dead_book.handle(message.body)

        def giving_up(message: Message, reason: BaseException | None) -> None:
            if reason is not None:  # None: copied to the dead-letter topic
                self.book.give_up(message.body, repr(reason))

        async def main() -> None:
            async with (
                smartnsq.Consumer(
                    self.flow.topic, CHANNEL, handle, max_attempts=2,
                    dead_letter_topic=self.dead_topic, on_giving_up=giving_up, **kwargs,
                ) as c,
                smartnsq.Consumer(self.dead_topic, CHECK, check, **kwargs),
            ):  # fmt: skip
                while not self._stop.is_set():
                    await anyio.sleep(0.05)
                self.stats = c.stats()
            self.stats = c.stats()

        self._thread = loop_thread(main, self)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def problems(self) -> list[str]:
        out = []
        if self.failure is not None:
            out.append(f"the dead-letter consumer raised {self.failure!r}")
        if self._thread is not None and self._thread.is_alive():
            out.append("the dead-letter consumer did not stop within 60 s")
        if self.stats is not None and self.stats.in_flight:
            out.append(f"stats() says {self.stats.in_flight} in flight after the stop")
        with self.book.lock:
            given_up = dict(self.book.given_up)
        # Given up without a copy: only a big body the dead-letter nsqd refused for its size.
        for body, reason in given_up.items():
            if not is_big(body) or "E_BAD_MESSAGE" not in reason:
                out.append(f"gave {body[:40]!r} up without a dead-letter copy: {reason}")
                break
        return out


class ProcSink(Door):
    """A sink that is a process: started again after a client signal; stopped with SIGTERM."""

    process = True
    proc: Proc

    def signal(self, sig: int) -> None:
        self.proc.signal(sig)
        self.proc.wait(30)

    def restart(self) -> None:
        self.proc.start()

    def start(self) -> None:
        self.proc.start()

    def stop(self) -> None:
        self.proc.signal(signal.SIGTERM)
        self.proc.wait(30)

    def stopped_status(self, how: str) -> int | None:
        """The exit status of a clean stop by the signal ``how``."""
        return SIGNALLED.get(how)

    def problems(self) -> list[str]:
        out = self.proc.stderr_problems()
        for _, status, how, _ in self.proc.runs:
            if status is None:
                out.append(f"{self.name} did not exit within 30 s of {how}")
            elif how == "ran to its end":
                out.append(f"{self.name} exited {status} by itself")
            elif status != self.stopped_status(how):
                expected = self.stopped_status(how)
                out.append(f"{self.name} exited {status} after {how} (a clean stop: {expected})")
        return out


class ToFileSink(ProcSink):
    name = "to-file"

    def __init__(self, flow: Flow, book: Book, lookupd: list[str], logs: Path) -> None:
        self.flow, self.book = flow, book
        self.out = logs / f"flow{flow.index}.files"
        self.work = logs / f"flow{flow.index}.work"
        argv = smartnsq_cli(
            "to-file", flow.topic, "--channel", CHANNEL, "--lookupd", ",".join(lookupd),
            "--output-dir", str(self.out), "--work-dir", str(self.work), "--json", *CLI_CONSUMER,
        )  # fmt: skip
        self.proc = Proc(argv, logs, f"flow{flow.index}.to-file")

    def collect(self) -> None:
        bodies: Counter[bytes] = Counter()
        for d in (self.out, self.work):
            for f in sorted(d.glob("*")) if d.exists() else []:
                bodies.update(x for x in f.read_bytes().split(b"\n") if x)
        self.book.set_handled(bodies)

    def problems(self) -> list[str]:
        out = super().problems()
        written = 0
        for _, status, _, path in self.proc.runs:
            lines = [x for x in Path(path).read_text().splitlines() if x.startswith("{")]
            summary = json.loads(lines[-1]) if lines else None
            if status in (0, *SIGNALLED.values()) and summary is None:
                out.append(f"to-file exited {status} without its --json summary ({path})")
            written += (summary or {}).get("written", 0)
        with self.book.lock:
            in_files = sum(self.book.handled.values())
        if written != in_files:
            out.append(f"to-file's summaries say {written} written; the files hold {in_files}")
        if self.work.exists() and any(self.work.iterdir()):
            out.append("to-file left files in its work dir after a clean stop")
        return out


class TailSink(ProcSink):
    name = "tail"

    def __init__(self, flow: Flow, book: Book, lookupd: list[str], logs: Path) -> None:
        self.flow, self.book = flow, book
        argv = smartnsq_cli(
            "tail", flow.topic, "--channel", CHANNEL, "--lookupd", ",".join(lookupd), "--json",
            *CLI_CONSUMER,
        )  # fmt: skip
        self.proc = Proc(argv, logs, f"flow{flow.index}.tail")

    def collect(self) -> None:
        bodies: Counter[bytes] = Counter()
        for path in self.proc.outputs():
            for line in Path(path).read_text().splitlines():
                if line.startswith("{") and "body" in (obj := json.loads(line)):
                    bodies[str(obj["body"]).encode()] += 1
        self.book.set_handled(bodies)


class RunnerSink(ProcSink):
    """``smartnsq.run(consumer)`` in a process of its own; its handler appends each body to
    a file and fsyncs it before returning."""

    name = "runner"

    def __init__(self, flow: Flow, book: Book, lookupd: list[str], logs: Path) -> None:
        self.flow, self.book = flow, book
        self.file = logs / f"flow{flow.index}.runner.txt"
        argv = [
            sys.executable, "-m", "tests.faults.campaign.runner_door",
            flow.topic, CHANNEL, ",".join(lookupd), str(self.file),
        ]  # fmt: skip
        self.proc = Proc(argv, logs, f"flow{flow.index}.runner")

    def collect(self) -> None:
        data = self.file.read_bytes() if self.file.exists() else b""
        self.book.set_handled(Counter(x for x in data.split(b"\n") if x))

    def stopped_status(self, how: str) -> int | None:
        return 0  # smartnsq.run returns after its graceful stop; the program exits 0


class ToNsqSink(ProcSink):
    """``smartnsq to-nsq`` copying the topic to ``TOPIC.copy``; a checker consumer reads the
    copies (what it handled is what the flow handled)."""

    name = "to-nsq"

    def __init__(
        self, flow: Flow, book: Book, lookupd: list[str], logs: Path, options: dict[str, Any]
    ) -> None:
        self.flow, self.book = flow, book
        argv = smartnsq_cli(
            "to-nsq", flow.topic, "--channel", CHANNEL, "--to", self.copy_topic,
            "--lookupd", ",".join(lookupd), "--json", *CLI_CONSUMER,
            "--producer-opt", "timeout=2s", "--producer-opt", "heartbeat_interval=1s",
        )  # fmt: skip
        self.proc = Proc(argv, logs, f"flow{flow.index}.to-nsq")
        copy = Flow(flow.index, flow.source, flow.sink, flow.rate)  # no failing, no slow
        self.checker = ConsumerSink(copy, book, lookupd, options, False)
        self.checker.topic, self.checker.channel = self.copy_topic, CHECK

    @property
    def copy_topic(self) -> str:
        return f"{self.flow.topic}.copy"

    def start(self) -> None:
        self.checker.start()
        super().start()

    def stop(self) -> None:
        super().stop()
        self.checker.stop()

    def problems(self) -> list[str]:
        return super().problems() + self.checker.problems()
