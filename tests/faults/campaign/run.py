"""One seed on real servers: start the cluster behind Toxiproxy, start the flows, inject the
faults, stop publishing, let it settle, stop, and check the invariants."""

from __future__ import annotations

import logging
import shutil
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compat.cluster import http_json
from compat.toxiproxy import ProxiedClassic, Toxiproxy, start_proxied_classic
from tests.faults.campaign import doors as d
from tests.faults.campaign.faults import Injector, Timeline, _post
from tests.faults.campaign.schedule import HEALED_BY, Fault, Flow, Schedule
from tests.faults.harness import Settings

PUBLISH_SHARE = HEALED_BY  # publishing stops when every fault has healed
SETTLE = 45.0  # seconds after publishing stopped within which every flow must have drained


def campaign_settings() -> Settings:
    return Settings()


def consumer_kwargs(settings: Settings) -> dict[str, Any]:
    # A failed handler's message comes back within a second; backoff stays short, so that a
    # short run drains (the defaults, 90 s and 128 s, are for production).
    return {
        **settings.consumer_kwargs(),
        "requeue_delay": 0.2,
        "max_requeue_delay": 1.0,
        "max_backoff_duration": 1.0,
        "backoff_unit": 0.1,
    }


@dataclass
class FlowResult:
    flow: Flow
    acked: int = 0
    handled: int = 0
    duplicates: int = 0
    failed_publishes: int = 0
    excused: int = 0  # acknowledged, lost with a node that lost its messages (nsqd's, not ours)


@dataclass
class Result:
    schedule: Schedule
    flows: list[FlowResult] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    logs: Path | None = None
    seconds: float = 0.0

    @property
    def messages(self) -> int:
        return sum(f.acked for f in self.flows)

    @property
    def duplicates(self) -> int:
        return sum(f.duplicates for f in self.flows)


def _channel_counts(nsqd_http: Sequence[str], topic: str, channel: str) -> dict[str, int]:
    """Of ``topic/channel``, summed over the nsqd at ``nsqd_http`` (and on the fork over the
    partitions they lead): depth (not consumed: neither in flight nor deferred), in flight
    and deferred."""
    out = {"depth": 0, "in_flight": 0, "deferred": 0}
    for http in nsqd_http:
        try:
            stats = http_json(f"http://{http}/stats?format=json&topic={topic}", timeout=3.0)
        except (OSError, ValueError):
            continue
        stats = (stats or {}).get("data", stats) or {}
        for t in stats.get("topics") or []:
            partitioned = "topic_partition" in t  # the fork
            if t.get("topic_name") != topic or (partitioned and not t.get("is_leader")):
                continue  # a replica's counts are not its partition's: its leader's are
            for c in t.get("channels") or []:
                if c.get("channel_name") != channel:
                    continue
                depth = int(c.get("depth", 0))
                in_flight = int(c.get("in_flight_count", 0))
                deferred = int(c.get("deferred_count", 0))
                if partitioned:
                    # The fork's depth is the partition's end less the channel's confirmed
                    # position: it counts what is in flight, and its in flight counts what is
                    # deferred (a message finished past an unfinished one counts until that
                    # one is: nothing tells them apart).
                    depth, in_flight = max(0, depth - in_flight), max(0, in_flight - deferred)
                out["depth"] += depth
                out["in_flight"] += in_flight
                out["deferred"] += deferred
    return out


def sink_channels(flow: Flow) -> list[tuple[str, str]]:
    """The channels a flow's messages wait in until its sink is done with them."""
    out = [(flow.topic, d.CHANNEL)]
    if flow.sink == "to-nsq":
        out.append((f"{flow.topic}.copy", d.CHECK))
    if flow.sink == "dead-letters":
        out.append((f"{flow.topic}.dead", d.CHECK))
    return out


def _extra_topics(flow: Flow) -> list[str]:
    return [t for t, _ in sink_channels(flow)]


def make_doors(
    flows: Sequence[Flow],
    publish_seconds: float,
    books: dict[int, d.Book],
    logs: Path,
    settings: Settings,
    lookupd: list[str],
    nsqd: list[str] | None = None,
    oversize: Sequence[Fault] = (),
) -> dict[str, d.Door]:
    """The doors of ``flows``: sinks find their topics through ``lookupd``; sources publish to
    ``nsqd``, or through ``lookupd`` without it (the fork's partitioned topics). ``oversize``:
    the schedule's "oversize" faults (pub's file has their big lines from the start)."""
    through = None if nsqd else lookupd
    ckw = consumer_kwargs(settings)
    out: dict[str, d.Door] = {}
    for flow in flows:
        book = books[flow.index]
        source: d.Door
        if flow.source == "async-producer":
            source = d.AsyncSource(flow, book, nsqd or [], settings, lookupd=through)
        elif flow.source == "blocking-producer":
            source = d.BlockingSource(flow, book, nsqd or [], settings, lookupd=through)
        else:
            windows = [(f.at, f.at + f.hold) for f in oversize if f.target == flow.topic]
            source = d.PubSource(
                flow, book, nsqd or [], logs, publish_seconds, windows, lookupd=through
            )
        sink: d.Door
        if flow.sink in ("async-consumer", "blocking-consumer"):
            sink = d.ConsumerSink(flow, book, lookupd, ckw, flow.sink == "blocking-consumer")
        elif flow.sink == "dead-letters":
            sink = d.DeadLetterSink(flow, book, lookupd, ckw)
        elif flow.sink == "to-file":
            sink = d.ToFileSink(flow, book, lookupd, logs)
        elif flow.sink == "tail":
            sink = d.TailSink(flow, book, lookupd, logs)
        elif flow.sink == "runner":
            sink = d.RunnerSink(flow, book, lookupd, logs)
        else:
            sink = d.ToNsqSink(flow, book, lookupd, logs, ckw)
        out[f"flow{flow.index}.source"] = source
        out[f"flow{flow.index}.sink"] = sink
    return out


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def run_seed(schedule: Schedule, root: Path, keep: bool = False) -> Result:
    """Run ``schedule``; its logs go to ``root/seed-N`` (removed when it passed, unless
    ``keep``)."""
    started = time.monotonic()
    logs = root / f"seed-{schedule.seed}"
    if logs.exists():
        shutil.rmtree(logs)
    logs.mkdir(parents=True)
    (logs / "schedule.txt").write_text(f"{schedule}\ndigest {schedule.digest()}\n")
    handler = logging.FileHandler(logs / "clients.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(name)s %(message)s"))
    log = logging.getLogger("smartnsq")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    result = Result(schedule, logs=logs)
    try:
        _run(schedule, logs, result)
    except Exception as exc:  # the campaign's own failure is a violation too: it is reported
        result.violations.append(f"campaign error: {exc!r}")
        (logs / "campaign-error.txt").write_text(traceback.format_exc())
    finally:
        log.removeHandler(handler)
        handler.close()
    result.seconds = time.monotonic() - started
    if not result.violations and not keep:
        shutil.rmtree(logs, ignore_errors=True)
        result.logs = None
    return result


def _run(schedule: Schedule, logs: Path, result: Result) -> None:
    if schedule.kind != "classic":
        from tests.faults.campaign.fork import run_fork  # it imports this module

        run_fork(schedule, logs, result)
        return
    settings = campaign_settings()
    toxi = Toxiproxy.start(logs / "toxiproxy")
    cluster: ProxiedClassic | None = None
    doors: dict[str, d.Door] = {}
    timeline = Timeline()
    try:
        # the last nsqd takes smaller messages than the others (the "oversize" fault)
        small = [f"--max-msg-size={d.SMALL_MAX_MSG_SIZE}"]
        cluster = start_proxied_classic(
            toxi,
            logs / "cluster",
            nsqd=schedule.nsqd,
            lookupd=schedule.lookupd,
            each_nsqd_args=[*[[]] * (schedule.nsqd - 1), small],
        )
        topics = {f.index: _extra_topics(f) for f in schedule.flows}
        for node in cluster.cluster.nsqd:  # every topic in the lookupds before anyone asks
            for flow in schedule.flows:
                for topic, channel in sink_channels(flow):
                    _post(node, "/topic/create", topic=topic)
                    _post(node, "/channel/create", topic=topic, channel=channel)
        books = {f.index: d.Book() for f in schedule.flows}
        doors = make_doors(
            schedule.flows,
            schedule.seconds * PUBLISH_SHARE,
            books,
            logs,
            settings,
            lookupd=[p.address for p in cluster.lookupd_http],
            nsqd=[p.address for p in cluster.nsqd_tcp],
            oversize=[f for f in schedule.faults if f.kind == "oversize"],
        )
        for name, door in doors.items():
            if name.endswith(".sink"):
                door.start()
        timeline = Timeline()  # the faults' offsets count from here
        for name, door in doors.items():
            if name.endswith(".source"):
                door.start()
        injector = Injector(cluster, doors, topics, timeline)
        injector.start(schedule.faults)
        time.sleep(schedule.seconds * PUBLISH_SHARE)  # the publishing window
        timeline.note("publishing stops")
        for name, door in doors.items():
            if name.endswith(".source"):
                door.stop()
        injector.join(60)
        toxi.heal()
        timeline.note("sources stopped, every fault healed")
        nsqd_http = [n.http for n in cluster.cluster.nsqd]
        settle_and_check(schedule, nsqd_http, doors, books, timeline, result)
    finally:
        for door in doors.values():  # what an error left running
            proc = getattr(door, "proc", None)
            if isinstance(proc, d.Proc) and proc.running():
                proc.signal(signal.SIGKILL)
                proc.wait(10)
        if cluster is not None:
            cluster.stop()
        toxi.stop()
        if doors:
            (logs / "timeline.txt").write_text(timeline.text() + "\n")


def settle_and_check(
    schedule: Schedule,
    nsqd_http: Sequence[str],
    doors: dict[str, d.Door],
    books: dict[int, d.Book],
    timeline: Timeline,
    result: Result,
    settle: float = SETTLE,
) -> None:
    """Wait up to ``settle`` seconds for every flow to drain, stop the sinks gracefully and
    check the invariants of every flow (``nsqd_http``: where nsqd's /stats are asked)."""
    sinks = {f.index: doors[f"flow{f.index}.sink"] for f in schedule.flows}
    for e in timeline.errors:
        result.violations.append(f"fault injection: {e}")

    def excusable(flow: Flow, body: bytes) -> bool:
        """Published before an nsqd lost what it held (SIGKILL, the topic deleted): that loss
        is nsqd's (memory queue, in flight), which no client can prevent. The publish's start
        counts, not its answer, which may reach the client after the nsqd died (seed 114)."""
        acked = books[flow.index].acked[body]
        return any(acked <= t for t in timeline.losses.get(flow.index, []))

    def drained(flow: Flow) -> bool:
        sinks[flow.index].collect()
        counts = [_channel_counts(nsqd_http, t, c) for t, c in sink_channels(flow)]
        waiting = any(sum(c.values()) for c in counts)
        missing = [b for b in books[flow.index].missing() if not excusable(flow, b)]
        return not waiting and not missing

    all_drained = wait_until(lambda: all(drained(f) for f in schedule.flows), settle)
    timeline.note(f"settled: {all_drained}")
    stuck = {
        f.index: {f"{t}/{c}": _channel_counts(nsqd_http, t, c) for t, c in sink_channels(f)}
        for f in schedule.flows
    }
    # graceful stop of every sink; then nothing of theirs may be in flight on nsqd
    for f in schedule.flows:
        sinks[f.index].stop()
        sinks[f.index].collect()
    timeline.note("sinks stopped")
    for f in schedule.flows:
        where = f"flow{f.index} ({f.source} -> {f.sink})"
        for t, c in sink_channels(f):
            left = _channel_counts(nsqd_http, t, c)["in_flight"]
            if left:
                result.violations.append(
                    f"in-flight-after-stop: {where}: {left} in flight on {t}/{c} after a "
                    "graceful stop"
                )
        book = books[f.index]
        missing = book.missing()
        excused = {b for b in missing if excusable(f, b)}
        lost = sorted(missing - excused)
        fr = FlowResult(
            f,
            acked=len(book.acked),
            handled=sum(book.handled.values()),
            duplicates=book.duplicates(),
            failed_publishes=book.failed_publishes,
            excused=len(excused),
        )
        result.flows.append(fr)
        waiting = {k: v for k, v in stuck[f.index].items() if sum(v.values())}
        if lost:
            kind = "stuck" if waiting else "lost"
            result.violations.append(
                f"{kind}: {where}: {len(lost)} of {fr.acked} acknowledged not handled "
                f"(e.g. {[b.decode() for b in lost[:3]]}); waiting after {settle:.0f} s: "
                f"{waiting or 'nothing'}"
            )
        elif waiting:
            result.violations.append(f"stuck: {where}: messages waiting after settling: {waiting}")
        unacked = book.unacked_handled()
        if unacked and f.source != "pub":  # pub: lines after its position may be stored
            failures = book.failed_publishes
            if unacked > failures:
                result.violations.append(
                    f"phantom: {where}: {unacked} handled bodies never acknowledged, more "
                    f"than the {failures} publishes that failed"
                )
        if fr.duplicates and not schedule.faults and not f.failing and not f.slow_ms:
            result.violations.append(
                f"duplicates: {where}: {fr.duplicates} duplicates in a run without faults"
            )
        for side in ("source", "sink"):
            for p in doors[f"flow{f.index}.{side}"].problems():
                result.violations.append(f"exit/summary: {where} {side}: {p}")
