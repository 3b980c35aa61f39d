"""A seed on the Youzan fork: 3 nsqd and 1-2 lookupds behind Toxiproxy, each flow's topic
of 2 partitions x 2 replicas. An ordered flow has keyed publishers and an ordered consumer
(``harness.CLIENTS``: the fault suites' clients and ``keyed.Book``); an unordered flow has the
classic front doors (:mod:`.doors`), which find the partitions through the lookupds. Checked
once it settles, by the classic checks (``run.settle_and_check``: nothing acknowledged lost, for the
fork replicates before it acknowledges: no excuse; no channel stuck; nothing in flight after
a graceful stop; exit statuses and summaries), plus per-key order on ordered topics and only
``smartnsq.errors`` types raised; duplicates counted."""

from __future__ import annotations

import signal
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from compat.toxiproxy import ProxiedYouzan, Proxy, Toxiproxy, start_proxied_youzan
from compat.youzan import create_topic, lookup, move_leader, poll, restore_writable
from smartnsq import Message
from smartnsq.errors import NSQError
from tests.faults.campaign import doors as d
from tests.faults.campaign.faults import TOXIC_NAMES, Injector, Timeline
from tests.faults.campaign.run import (
    PUBLISH_SHARE,
    Result,
    make_doors,
    settle_and_check,
    sink_channels,
)
from tests.faults.campaign.schedule import Fault, Flow, Schedule
from tests.faults.harness import CLIENTS, FAULTS, PUBLISHERS, Clients, Settings, Target
from tests.faults.keyed import Book

SETTINGS = Settings(reconnect_max=2.0, msg_timeout=5.0, max_retries=3)  # the fault suite's
SETTLE = 120.0  # a new leader can take a while to be writable (docs/guarantees.md)


class Keyed:
    """An ordered flow's workload: ``keyed.Book`` numbers the bodies per key and checks
    their order; the flow's :class:`doors.Book` books them too, for the checks every flow
    shares."""

    def __init__(self, book: d.Book) -> None:
        self.keyed, self.book = Book(), book

    def next_publish(self, task: int) -> tuple[bytes, dict[str, object]]:
        return self.keyed.next_publish(task)

    def ack(self, body: bytes) -> None:
        self.keyed.ack(body)
        self.book.ack(body)

    def error(self, exc: BaseException) -> None:
        self.keyed.error(exc)
        self.book.error(exc)

    def handle(self, message: Message) -> None:
        self.keyed.handle(message)
        self.book.handle(message.body)


class OrderedSink(d.Door):
    """An ordered flow's clients, publishers and consumer started together; stopping the
    sink closes them (the consumer's graceful stop)."""

    name = "ordered-consumer"

    def __init__(self, clients: Clients) -> None:
        self.clients = clients
        self.closed = False

    def start(self) -> None:
        self.clients.start()

    def stop(self) -> None:
        if not self.closed:
            self.closed = True
            self.clients.close()


class OrderedSource(d.Door):
    """An ordered flow's publishers: they start with its sink; stopping ends publishing."""

    def __init__(self, flow: Flow, book: d.Book, clients: Clients) -> None:
        self.name, self.book, self.clients = flow.source, book, clients

    def stop(self) -> None:
        self.clients.stop_publishing()

    def problems(self) -> list[str]:
        if foreign := _foreign(self.book):
            n = len(foreign)
            return [f"raised {n} errors that are not smartnsq.errors types: {foreign[:3]!r}"]
        return []


def _topics(flow: Flow) -> list[tuple[str, str]]:
    """The flow's topics and the channel each is read from (the fork refuses unknown ones)."""
    return sink_channels(flow)


def run_fork(schedule: Schedule, logs: Path, result: Result) -> None:
    toxi = Toxiproxy.start(logs / "toxiproxy")
    cluster: ProxiedYouzan | None = None
    doors: dict[str, d.Door] = {}
    timeline = Timeline()
    try:
        cluster = start_proxied_youzan(
            toxi, logs / "cluster", nsqd=schedule.nsqd, lookupd=schedule.lookupd
        )
        lookupds = [cluster.public(n.http) for n in cluster.cluster.lookupd]
        books = {f.index: d.Book() for f in schedule.flows}
        keyed: dict[int, Keyed] = {}
        for f in schedule.flows:
            for topic, channel in _topics(f):
                # unordered: 4 partition replicas on 3 nsqd need the fork's multipart
                create_topic(
                    cluster.cluster, topic, partitions=2, replicas=2, ordered=f.ordered,
                    multipart=not f.ordered, channel=channel,
                )  # fmt: skip
        unordered = [f for f in schedule.flows if not f.ordered]
        doors = make_doors(
            unordered, schedule.seconds * PUBLISH_SHARE, books, logs, SETTINGS, lookupd=lookupds
        )
        for f in schedule.flows:
            if not f.ordered:
                continue
            target = Target(
                f.topic, d.CHANNEL, producer_lookupd=lookupds, consumer_lookupd=lookupds
            )
            kind = "async" if f.source == "async-producer" else "sync"
            keyed[f.index] = Keyed(books[f.index])
            clients = CLIENTS[kind](target, SETTINGS, keyed[f.index], PUBLISHERS / f.rate)
            doors[f"flow{f.index}.source"] = OrderedSource(f, books[f.index], clients)
            doors[f"flow{f.index}.sink"] = OrderedSink(clients)
        for name, door in doors.items():
            if name.endswith(".sink"):
                door.start()
        timeline = Timeline()  # the faults' offsets count from here
        for name, door in doors.items():
            if name.endswith(".source"):
                door.start()
        injector = Injector(None, doors, {}, timeline, partial(_inject, cluster, timeline=timeline))
        injector.start(schedule.faults)
        time.sleep(schedule.seconds * PUBLISH_SHARE)  # the publishing window
        timeline.note("publishing stops")
        for name, door in doors.items():
            if name.endswith(".source"):
                door.stop()
        injector.join(180)
        cluster.heal()
        for f in schedule.flows:  # a partition may have lost its writable leader meanwhile
            for topic, channel in _topics(f):
                restore_writable(cluster.cluster, topic, channel)
        timeline.note("sources stopped, every fault healed")
        nsqd_http = [n.http for n in cluster.cluster.nsqd]
        settle_and_check(schedule, nsqd_http, doors, books, timeline, result, settle=SETTLE)
        for f in schedule.flows:
            where = f"flow{f.index} ({f.source} -> {f.sink})"
            if f.ordered and (order := keyed[f.index].keyed.order_violations()):
                result.violations.append(
                    f"order: {where}: {len(order)} handled after a later one of their key "
                    f"(key, seq, highest before: {order[:3]})"
                )
            if foreign := _foreign(books[f.index]):  # named by the checks; written with
                with open(logs / "foreign-errors.txt", "a") as out:  # where they came from
                    for e in foreign[:5]:
                        out.write("".join(traceback.format_exception(e)) + "\n")
    finally:
        for name, door in doors.items():  # what an error left running
            if isinstance(door, OrderedSink):
                try:
                    door.stop()
                except Exception as exc:  # the cluster is stopped all the same
                    timeline.note(f"closing {name} failed: {exc!r}")
            proc = getattr(door, "proc", None)
            if isinstance(proc, d.Proc) and proc.running():
                proc.signal(signal.SIGKILL)
                proc.wait(10)
        if cluster is not None:
            cluster.stop()
        toxi.stop()
        (logs / "timeline.txt").write_text(timeline.text() + "\n")


def _foreign(book: d.Book) -> list[BaseException]:
    with book.lock:
        return [e for e in book.errors if not isinstance(e, NSQError)]


def _leader(cluster: ProxiedYouzan, target: str) -> int:
    topic, partition = target.split(":")

    def listed() -> dict[str, Any] | None:
        # Each lookupd asked directly, not through its proxy, and again until one lists the
        # partition: a lookupd-down fault holds a proxy, and the lookupd behind it forgets
        # the nsqd that cannot reach it meanwhile.
        for lookupd in cluster.cluster.lookupd:
            parts = lookup(lookupd.http, topic, "r").get("partitions") or {}
            if partition in parts:
                node: dict[str, Any] = parts[partition]
                return node
        return None

    node = poll(f"a lookupd listing the leader of {target}", listed, timeout=30.0)
    return cluster.nsqd_index(f"{node['broadcast_address']}:{node['tcp_port']}")


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
