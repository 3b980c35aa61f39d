"""Seed -> schedule: the cluster, the flows (a front door publishing, one consuming) and the
faults with their offsets. Pure: no clock, no I/O, no global random state; the same seed,
kind and duration give the same schedule, named by :meth:`Schedule.digest`."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, field

KINDS = ("classic", "youzan")

# Front doors that publish numbered bodies to a flow's topic.
SOURCES = ("async-producer", "blocking-producer", "pub")
# Front doors that take the flow's topic out of NSQ: handled, copied, in a file, printed.
SINKS = (
    "async-consumer",  # smartnsq.Consumer, async handler
    "blocking-consumer",  # smartnsq.sync.Consumer, plain def handler
    "dead-letters",  # async consumer, max_attempts=2, some bodies always fail
    "to-file",  # smartnsq to-file
    "to-nsq",  # smartnsq to-nsq, copied to TOPIC.copy, read back by a checker
    "tail",  # smartnsq tail --channel
    "runner",  # smartnsq.run(consumer) in its own process
)
# Sinks that are processes of their own (a client signal can be sent to them); pub too.
PROCESS_DOORS = ("pub", "to-file", "to-nsq", "tail", "runner")

# The fork: a flow is ordered (keyed publishers, 4 tasks or threads, and an ordered consumer,
# async or def handler as the publishers, on an ordered topic) or unordered (the doors above
# on an unordered topic); either topic has 2 partitions x 2 replicas.
FORK_SOURCES = ("async-producer", "blocking-producer")  # an ordered flow's keyed publishers
FORK_SINKS = ("ordered-consumer",)
ORDERED_SHARE = 1 / 3  # of the fork's flows

NODE_FAULTS = ("nsqd-stop", "nsqd-kill", "nsqd-term")
TOXICS = ("silence", "reset", "refused", "latency", "slicer", "bandwidth")
HEALED_BY = 0.85  # every fault has healed by this share of the run (publishing stops then)
# oversize: a flow's source mixes in bodies bigger than the last nsqd's --max-msg-size (the
# others take them): that nsqd refuses them as a publish's or a copy's destination.
FAULT_KINDS = (
    *NODE_FAULTS, *TOXICS, "lookupd-down", "topic-recreate", "client-signal", "oversize",
)  # fmt: skip
# On the fork: a partition's leader moved to a replica, or killed (a replica takes over).
FORK_FAULT_KINDS = (
    "nsqd-stop", *TOXICS, "lookupd-down", "leader-move", "leader-kill", "client-signal",
)  # fmt: skip


@dataclass(frozen=True)
class Flow:
    """One topic: ``source`` publishes to it, ``sink`` takes it out."""

    index: int
    source: str
    sink: str
    rate: int  # publishes per second, all publishers of the source together
    failing: float = 0.0  # share of bodies whose first attempt fails (consumer sinks)
    slow_ms: int = 0  # how long a slow handler takes (every 7th body)

    @property
    def topic(self) -> str:
        return f"flow{self.index}"

    @property
    def ordered(self) -> bool:
        """An ordered topic of the fork, keyed publishers and an ordered consumer."""
        return self.sink in FORK_SINKS


@dataclass(frozen=True)
class Fault:
    """``kind`` on ``target`` (``nsqd1``, ``lookupd0``, ``flow2``, ``flow0.source``) from
    ``at`` seconds into the run for ``hold`` seconds; ``how`` refines it (a signal name)."""

    kind: str
    target: str
    at: float
    hold: float
    how: str = ""


@dataclass(frozen=True)
class Schedule:
    seed: int
    kind: str
    seconds: float
    nsqd: int
    lookupd: int
    flows: tuple[Flow, ...]
    faults: tuple[Fault, ...] = field(default=())

    def digest(self) -> str:
        """Hex digest of everything the run does: equal digests, equal runs."""
        text = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def fault_kinds(self) -> list[str]:
        return [f.kind for f in self.faults]

    def doors(self) -> list[str]:
        return sorted({d for f in self.flows for d in (f.source, f.sink)})


def generate(seed: int, kind: str = "classic", minutes: float = 1.0) -> Schedule:
    """The schedule of ``seed``: 2-4 flows, 1-4 faults at offsets within the first 70 % of
    the run (each healed before 85 %), so that the rest of the run shows the recovery."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    if not minutes > 0:
        raise ValueError(f"minutes must be > 0, not {minutes!r}")
    # A private generator seeded with the seed and the kind: nothing else influences it.
    rng = random.Random(f"smartnsq-campaign:{kind}:{seed}")
    seconds = round(minutes * 60, 3)
    classic = kind == "classic"
    nsqd = 2 if classic else 3
    lookupd = rng.choice((1, 2))
    flows = []
    for i in range(rng.randint(2, 4) if classic else rng.randint(1, 2)):
        ordered = not classic and rng.random() < ORDERED_SHARE
        sources, sinks = (FORK_SOURCES, FORK_SINKS) if ordered else (SOURCES, SINKS)
        flow = Flow(
            index=i,
            source=rng.choice(sources),
            sink=rng.choice(sinks),
            rate=rng.choice((20, 50, 100)),
            # the ordered consumers (the fault suites') neither fail nor dawdle
            failing=rng.choice((0.0, 0.0, 0.05, 0.2)) * (not ordered),
            slow_ms=rng.choice((0, 0, 20, 200)) * (not ordered),
        )
        flows.append(flow)
    faults = []
    for _ in range(rng.randint(1, 4)):
        fault_kind = rng.choice(FAULT_KINDS if classic else FORK_FAULT_KINDS)
        hold = round(rng.uniform(1.0, min(6.0, 0.15 * seconds + 1.0)), 2)
        at = round(rng.uniform(0.1 * seconds, max(0.1 * seconds, 0.7 * seconds - hold)), 2)
        how = ""
        if fault_kind in (*NODE_FAULTS, *TOXICS):
            target = f"nsqd{rng.randrange(nsqd)}"
        elif fault_kind == "lookupd-down":
            target = f"lookupd{rng.randrange(lookupd)}"
        elif fault_kind in ("leader-move", "leader-kill"):
            # partition 0 or 1 of a flow's topic; the runner finds its leader at the time
            target = f"{rng.choice(flows).topic}:{rng.randrange(2)}"
        elif fault_kind == "oversize":
            target = rng.choice(flows).topic
        elif fault_kind == "topic-recreate":
            target = f"nsqd{rng.randrange(nsqd)}/{rng.choice(flows).topic}"
        else:  # client-signal: a process door of some flow, or nothing if there is none
            doors = [
                f"flow{f.index}.{side}"
                for f in flows
                for side, door in (("source", f.source), ("sink", f.sink))
                if door in PROCESS_DOORS
            ]
            if not doors:
                continue
            target = rng.choice(doors)
            how = rng.choice(("SIGINT", "SIGTERM"))
        faults.append(Fault(fault_kind, target, at, hold, how))
    faults = _apart(faults, HEALED_BY * seconds)
    faults.sort(key=lambda f: (f.at, f.kind, f.target))
    return Schedule(seed, kind, seconds, nsqd, lookupd, tuple(flows), tuple(faults))


def _node(fault: Fault) -> str:
    if fault.kind in ("leader-move", "leader-kill"):
        return "leaders"  # one leadership change at a time
    return fault.target.split("/")[0].split(".")[0]


def _apart(faults: list[Fault], end: float) -> list[Fault]:
    """Faults on one node (an nsqd, a lookupd, a flow's process) one after another: a
    fault starting while another holds the same node moves to 0.5 s after it heals, or is
    dropped when it would then last beyond ``end``."""
    free: dict[str, float] = {}
    out = []
    for f in sorted(faults, key=lambda f: (f.at, f.kind, f.target)):
        at = max(f.at, free.get(_node(f), 0.0))
        if at + f.hold > end:
            continue
        free[_node(f)] = round(at + f.hold + 0.5, 2)
        out.append(Fault(f.kind, f.target, round(at, 2), f.hold, f.how))
    return out
