"""Faults of a schedule, each injected at its offset and healed after its hold, in a thread
of its own; what happened and when goes to the run's timeline."""

from __future__ import annotations

import signal
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field

from compat.cluster import Daemon, http_request
from compat.toxiproxy import ProxiedClassic
from tests.faults.campaign.doors import CHANNEL, CHECK, Door
from tests.faults.campaign.schedule import Fault
from tests.faults.harness import FAULTS

TOXIC_NAMES = {"silence": "silent"}  # schedule's name -> the fault suites' name


@dataclass
class Timeline:
    t0: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    events: list[tuple[float, str]] = field(default_factory=list)
    # flow index -> when a node holding its messages lost them (SIGKILL, topic deleted)
    losses: dict[int, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def note(self, text: str) -> float:
        now = time.monotonic()
        with self.lock:
            self.events.append((now - self.t0, text))
        return now

    def text(self) -> str:
        with self.lock:
            return "\n".join(f"{t:8.2f}s  {e}" for t, e in self.events)


def _ready(d: Daemon, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if http_request(f"http://{d.http}/ping", timeout=1.0)[0] == 200:
                return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


class Injector:
    """Runs the faults of a schedule against a proxied classic cluster and the doors; on
    another cluster (the fork) ``inject`` puts the cluster's faults in place instead (and
    returns what heals them), while client signals still go to the doors from here."""

    def __init__(
        self,
        cluster: ProxiedClassic | None,
        doors: dict[str, Door],
        topics: dict[int, list[str]],
        timeline: Timeline,
        inject: Callable[[Fault], Callable[[], None]] | None = None,
    ) -> None:
        self.cluster, self.doors, self.topics, self.timeline = cluster, doors, topics, timeline
        self.inject = inject
        self.threads: list[threading.Thread] = []
        self.stopped: set[int] = set()

    def start(self, faults: tuple[Fault, ...]) -> None:
        for fault in faults:
            t = threading.Thread(target=self._run, args=(fault,), daemon=True)
            t.start()
            self.threads.append(t)

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                self.timeline.errors.append("a fault did not heal in time")

    def _run(self, fault: Fault) -> None:
        delay = self.timeline.t0 + fault.at - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # the fault's offset in the schedule
        what = f"{fault.kind} {fault.target} {fault.how}".strip()
        try:
            heal = self._inject(fault)
            self.timeline.note(f"inject {what} for {fault.hold}s")
            time.sleep(fault.hold)  # the fault's duration
            heal()
            self.timeline.note(f"healed {what}")
        except Exception as exc:  # the campaign's own trouble, reported as such
            self.timeline.errors.append(f"{what}: {exc!r}")
            self.timeline.note(f"fault failed {what}: {exc!r}")

    def _nsqd(self, target: str) -> tuple[int, Daemon]:
        assert self.cluster is not None
        i = int(target.split("/")[0].removeprefix("nsqd"))
        return i, self.cluster.cluster.nsqd[i]

    def _inject(self, fault: Fault) -> Callable[[], None]:
        kind = fault.kind
        if self.inject is not None and kind != "client-signal":
            return self.inject(fault)
        if kind in ("nsqd-stop", "nsqd-kill", "nsqd-term"):
            i, d = self._nsqd(fault.target)
            sig = {"nsqd-stop": signal.SIGSTOP, "nsqd-kill": signal.SIGKILL}.get(
                kind, signal.SIGTERM
            )
            d.signal(sig)
            if kind == "nsqd-stop":
                return lambda: d.signal(signal.SIGCONT)
            d.wait_exit(15.0)
            d.reap()
            if kind == "nsqd-kill":
                # Noted once it is dead: an answer that left before may still have been on
                # its way to the client when the signal was sent.
                lost = self.timeline.note(f"SIGKILL {d.name}: dead")
                for flow in self.topics:
                    self.timeline.losses.setdefault(flow, []).append(lost)

            def restart() -> None:
                d.spawn()
                if not _ready(d):
                    raise RuntimeError(f"{d.name} did not answer /ping after its restart")

            return restart
        if kind in FAULTS or kind in TOXIC_NAMES:
            inject = FAULTS[TOXIC_NAMES.get(kind, kind)][0]
            i, _ = self._nsqd(fault.target)
            proxies = self.cluster.nodes(i)
            for p in proxies:
                inject(p)

            def heal() -> None:
                for p in proxies:
                    p.heal()

            return heal
        if kind == "lookupd-down":
            d = self.cluster.cluster.lookupd[int(fault.target.removeprefix("lookupd"))]
            d.signal(signal.SIGTERM)
            d.wait_exit(15.0)
            d.reap()

            def up() -> None:
                d.spawn()
                if not _ready(d):
                    raise RuntimeError(f"{d.name} did not answer /ping after its restart")

            return up
        if kind == "topic-recreate":
            node, flow_name = fault.target.split("/")
            _, d = self._nsqd(node)
            flow = int(flow_name.removeprefix("flow"))
            topic = self.topics[flow][0]
            _post(d, "/topic/delete", topic=topic)
            # Noted once deleted: what was acknowledged while the delete ran may be gone too
            # (seed 187 counted such a message as lost).
            lost = self.timeline.note(f"deleted {topic} on {d.name}")
            self.timeline.losses.setdefault(flow, []).append(lost)

            def recreate() -> None:
                for t in self.topics[flow]:
                    _post(d, "/topic/create", topic=t)
                    _post(d, "/channel/create", topic=t, channel=CHANNEL if t == topic else CHECK)

            return recreate
        if kind == "oversize":  # the source mixes in big bodies for the hold
            event = getattr(self.doors[f"{fault.target}.source"], "oversize", None)
            if event is None:  # pub: its file has them at the fault's offsets already
                return lambda: None
            event.set()
            return event.clear
        if kind == "client-signal":
            door = self.doors[fault.target]
            door.signal(signal.Signals[fault.how])
            return door.restart
        raise ValueError(f"unknown fault kind {kind!r}")


def _post(d: Daemon, path: str, **query: str) -> None:
    url = f"http://{d.http}{path}?{urllib.parse.urlencode(query)}"
    status, body = http_request(url, method="POST", timeout=5.0)
    if status != 200:
        raise RuntimeError(f"POST {url} -> {status} {body[:200]!r}")
