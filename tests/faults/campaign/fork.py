"""A seed on the Youzan fork: 3 nsqd and 1-2 lookupds behind Toxiproxy; each flow is an
ordered topic (2 partitions x 2 replicas) with keyed publishers and an ordered consumer
(``harness.CLIENTS``: the fault suites' clients and ``keyed.Book``). Checked once it settles:
nothing acknowledged lost (the fork replicates before it acknowledges: no excuse), per-key
order kept, only ``smartnsq.errors`` types raised; duplicates counted."""

from __future__ import annotations

import signal
import threading
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path

from compat.toxiproxy import ProxiedYouzan, Proxy, Toxiproxy, start_proxied_youzan
from compat.youzan import create_topic, lookup, move_leader, restore_writable
from tests.faults.campaign.faults import TOXIC_NAMES, Timeline
from tests.faults.campaign.run import PUBLISH_SHARE, FlowResult, Result
from tests.faults.campaign.schedule import Fault, Schedule
from tests.faults.harness import CLIENTS, FAULTS, PUBLISHERS, Clients, Settings, Target
from tests.faults.keyed import Book

SETTINGS = Settings(reconnect_max=2.0, msg_timeout=5.0, max_retries=3)  # the fault suite's
SETTLE = 120.0  # a new leader can take a while to be writable (docs/guarantees.md)


def run_fork(schedule: Schedule, logs: Path, result: Result) -> None:
    toxi = Toxiproxy.start(logs / "toxiproxy")
    cluster: ProxiedYouzan | None = None
    clients: dict[int, Clients] = {}
    timeline = Timeline()
    try:
        cluster = start_proxied_youzan(
            toxi, logs / "cluster", nsqd=schedule.nsqd, lookupd=schedule.lookupd
        )
        lookupds = [cluster.public(d.http) for d in cluster.cluster.lookupd]
        books = {f.index: Book() for f in schedule.flows}
        for f in schedule.flows:
            create_topic(cluster.cluster, f.topic, partitions=2, replicas=2, ordered=True)
            target = Target(f.topic, "ch", producer_lookupd=lookupds, consumer_lookupd=lookupds)
            kind = "async" if f.source == "async-producer" else "sync"
            clients[f.index] = CLIENTS[kind](target, SETTINGS, books[f.index], PUBLISHERS / f.rate)
        for c in clients.values():
            c.start()
        timeline = Timeline()
        threads = [
            threading.Thread(target=_fault, args=(cluster, f, timeline), daemon=True)
            for f in schedule.faults
        ]
        for t in threads:
            t.start()
        time.sleep(schedule.seconds * PUBLISH_SHARE)  # the publishing window
        timeline.note("publishing stops")
        for c in clients.values():
            c.stop_publishing()
        for t in threads:
            t.join(180)
        cluster.heal()
        for f in schedule.flows:  # a partition may have lost its writable leader meanwhile
            restore_writable(cluster.cluster, f.topic)
        timeline.note("every fault healed")
        deadline = time.monotonic() + SETTLE
        while any(b.lost() for b in books.values()) and time.monotonic() < deadline:
            time.sleep(0.2)
        timeline.note("settled")
        for f in schedule.flows:
            clients.pop(f.index).close()
            book = books[f.index]
            where = f"flow{f.index} ({f.source} -> {f.sink})"
            result.flows.append(
                FlowResult(
                    f,
                    acked=len(book.acked),
                    handled=book.handled_count(),
                    duplicates=book.duplicates(),
                    failed_publishes=len(book.errors),
                )
            )
            if lost := book.lost():
                result.violations.append(
                    f"lost: {where}: {len(lost)} of {len(book.acked)} acknowledged not handled "
                    f"within {SETTLE:.0f} s (e.g. {lost[:3]})"
                )
            if order := book.order_violations():
                result.violations.append(
                    f"order: {where}: {len(order)} handled after a later one of their key "
                    f"(key, seq, highest before: {order[:3]})"
                )
            if foreign := book.foreign_errors():
                with open(logs / "foreign-errors.txt", "a") as out:  # where they came from
                    for e in foreign[:5]:
                        out.write("".join(traceback.format_exception(e)) + "\n")
                result.violations.append(
                    f"errors: {where}: {len(foreign)} not smartnsq.errors types: {foreign[:3]!r}"
                )
        for e in timeline.errors:
            result.violations.append(f"fault injection: {e}")
    finally:
        for c in clients.values():
            c.close()
        if cluster is not None:
            cluster.stop()
        toxi.stop()
        (logs / "timeline.txt").write_text(timeline.text() + "\n")


def _leader(cluster: ProxiedYouzan, target: str) -> int:
    topic, partition = target.split(":")
    lookupd = cluster.public(cluster.cluster.lookupd[0].http)
    node = lookup(lookupd, topic, "r")["partitions"][partition]
    return cluster.nsqd_index(f"{node['broadcast_address']}:{node['tcp_port']}")


def _fault(cluster: ProxiedYouzan, fault: Fault, timeline: Timeline) -> None:
    delay = timeline.t0 + fault.at - time.monotonic()
    if delay > 0:
        time.sleep(delay)  # the fault's offset in the schedule
    what = f"{fault.kind} {fault.target}"
    try:
        heal = _inject(cluster, fault, timeline)
        timeline.note(f"inject {what} for {fault.hold}s")
        time.sleep(fault.hold)  # the fault's duration
        heal()
        timeline.note(f"healed {what}")
    except Exception as exc:  # the campaign's own trouble, reported as such
        timeline.errors.append(f"{what}: {exc!r}")
        timeline.note(f"fault failed {what}: {exc!r}")


def _heal(proxies: list[Proxy]) -> None:
    for p in proxies:
        p.heal()


def _inject(cluster: ProxiedYouzan, fault: Fault, timeline: Timeline) -> Callable[[], None]:
    kind, c = fault.kind, cluster.cluster
    if kind == "nsqd-stop":
        d = c.nsqd[int(fault.target.removeprefix("nsqd"))]
        d.signal(signal.SIGSTOP)
        return lambda: d.signal(signal.SIGCONT)
    if kind in TOXIC_NAMES or kind in FAULTS:
        inject = FAULTS[TOXIC_NAMES.get(kind, kind)][0]
        proxies = cluster.nsqd(int(fault.target.removeprefix("nsqd")))
        for p in proxies:
            inject(p)
        return partial(_heal, proxies)
    if kind == "lookupd-down":  # silent: the fork's lookupds elect a leader among themselves
        proxies = cluster.lookupd(int(fault.target.removeprefix("lookupd")))
        for p in proxies:
            p.silence()
        return partial(_heal, proxies)
    topic, partition = fault.target.split(":")
    leader = _leader(cluster, fault.target)
    if kind == "leader-move":
        for to in range(len(c.nsqd)):
            if to == leader:
                continue
            try:
                move_leader(c, topic, int(partition), to, timeout=20.0)
            except Exception as exc:  # not a replica of the partition: the next one
                timeline.note(f"move to nsqd{to} refused: {exc!r}")
                continue
            timeline.note(f"moved {fault.target} from nsqd{leader} to nsqd{to}")
            break
        else:
            # the fork may finish a move late, or to another replica: moved all the same
            now = _leader(cluster, fault.target)
            if now == leader:
                raise RuntimeError(f"no nsqd took over {fault.target} from nsqd{leader}")
            timeline.note(f"{fault.target} moved from nsqd{leader} to nsqd{now} after all")
        return lambda: None
    if kind == "leader-kill":
        c.kill_nsqd(leader)
        timeline.note(f"killed nsqd{leader}, leader of {fault.target}")

        def take_over() -> None:
            restore_writable(c, topic)
            c.restart_nsqd(leader)

        return take_over
    raise ValueError(f"unknown fault kind {kind!r}")
