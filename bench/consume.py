"""Consume benchmark: smartnsq vs peer Python clients vs nsqd's bench_reader.

    python -m bench.consume [--rounds 3] [--quick] [--clients a,b]

Workload (one classic nsqd v1.3.0 on 127.0.0.1): a fresh topic and its channel
are created, N = 500,000 100-byte messages are pre-filled over HTTP /mpub
(untimed), then the client consumes them with max_in_flight 2500 and FINs every
one through its normal consumer API.  Timed from consumer start (t_start, noted
by the driver just before it creates its consumer) to the moment nsqd's stats
show the channel drained: depth 0 and nothing in flight or deferred.  The
ceiling is ``GOMAXPROCS=1 bench_reader`` (one connection, RDY 2500), timed from
its spawn; it never flushes its last partial buffer of FINs, so for it "done"
is depth 0 with at most 195 messages in flight; the runner then ends it with
SIGTERM.

Every round runs every client in an order rotated by one per round.  Raw
results go to bench/results/consume-<time>.json; a full run then rewrites the
"Consume" section of BENCHMARKS.md (see bench.summarize).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import common as c
from bench import summarize

GO = "bench_reader"
CHANNEL = "bench"
MSG = b"x" * 100
GO_UNFLUSHED = 195  # bench_reader's unflushed FINs: 4 KiB buffer / 21-byte FIN, per connection


@dataclass(frozen=True)
class Entry:
    """One row of the consume table: a client driver and its variant."""

    name: str
    client: str  # key of c.CLIENTS, or GO
    variant: str = ""
    label: str = ""
    source: str = ""  # a checkout to import smartnsq from (--baseline)


ENTRIES: dict[str, Entry] = {
    e.name: e
    for e in [
        Entry("smartnsq", "smartnsq", "async", "smartnsq (asyncio), async handler"),
        Entry("smartnsq-sync", "smartnsq", "sync", "smartnsq (asyncio), sync handler"),
        Entry("smartnsq-uvloop", "smartnsq", "uvloop", "smartnsq (uvloop), async handler"),
        Entry("pynsq", "pynsq", "", "pynsq 0.9.1 (tornado)"),
        Entry("gnsq", "gnsq", "", "gnsq 1.0.2 (gevent)"),
        Entry("nsq-py", "nsq-py", "", "nsq-py 0.1.12 (sync sockets)"),
        Entry("ansq", "ansq", "", "ansq 0.3.0 (asyncio), RDY 2500 via `conn.rdy()`"),
        Entry("asyncnsq", "asyncnsq", "", "asyncnsq 1.2.1 (asyncio)"),
        Entry(GO, GO, "", "Go `bench_reader`, GOMAXPROCS=1, 1 connection (ceiling)"),
    ]
}
DEFAULT = [
    "smartnsq",
    "smartnsq-sync",
    "smartnsq-uvloop",
    "pynsq",
    "nsq-py",
    "asyncnsq",
    "ansq",
    "gnsq",
    GO,
]


def params(quick: bool) -> dict[str, Any]:
    return {"n": 50_000 if quick else 500_000, "mif": 2500, "chunk": 5000, "timeout": 300.0}


def prefill(nsqd: c.Nsqd, topic: str, n: int, chunk: int) -> float:
    """Fresh topic + channel, then n messages via HTTP /mpub; returns seconds taken."""
    t0 = time.monotonic()
    nsqd.delete_topic(topic)
    nsqd.create_topic(topic)
    nsqd.create_channel(topic, CHANNEL)
    sent = 0
    while sent < n:
        k = min(chunk, n - sent)
        nsqd.mpub_binary(topic, MSG, k)
        sent += k
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ch = nsqd.channel_stats(topic, CHANNEL)
        if ch and ch["depth"] == n:
            return time.monotonic() - t0
        time.sleep(0.01)
    raise RuntimeError(f"prefill: channel depth never reached {n}: {ch}")


def drained(ch: dict[str, Any] | None, in_flight_max: int = 0) -> bool:
    return bool(
        ch
        and ch["depth"] == 0
        and ch["in_flight_count"] <= in_flight_max
        and ch["deferred_count"] == 0
    )


def wait_drained(
    nsqd: c.Nsqd, topic: str, deadline: float, in_flight_max: int, poll: float
) -> tuple[float | None, dict[str, Any] | None]:
    ch = None
    while time.monotonic() < deadline:
        ch = nsqd.channel_stats(topic, CHANNEL)
        if drained(ch, in_flight_max):
            return time.monotonic(), ch
        time.sleep(poll)
    return None, ch


def final_check(nsqd: c.Nsqd, topic: str, n: int, in_flight_max: int) -> dict[str, Any]:
    """nsqd's view once drained (clients still connected): channel counters and
    the FIN count summed over the channel's clients."""
    ch = nsqd.channel_stats(topic, CHANNEL, clients=True) or {}
    clients = ch.get("clients") or []
    fin = sum(int(x.get("finish_count", 0)) for x in clients)
    keys = ("depth", "in_flight_count", "deferred_count", "message_count")
    out: dict[str, Any] = {k: ch.get(k) for k in keys}
    out.update(
        requeue_count=ch.get("requeue_count"),
        timeout_count=ch.get("timeout_count"),
        finish_count=fin,
        clients=len(clients),
        topic_message_count=nsqd.message_count(topic),
    )
    errs = []
    if not drained(ch, in_flight_max):
        errs.append("channel not drained")
    if out["message_count"] != n or out["topic_message_count"] != n:
        errs.append(f"message_count {out['message_count']}/{out['topic_message_count']} != {n}")
    if out["requeue_count"] or out["timeout_count"]:
        errs.append(f"requeued {out['requeue_count']}, timed out {out['timeout_count']}")
    if fin + int(ch.get("in_flight_count") or 0) != n or (in_flight_max == 0 and fin != n):
        errs.append(f"nsqd counted {fin} FINs for {n} messages")
    out["error"] = "; ".join(errs) or None
    return out


def measures(pr: c.ProcResult) -> dict[str, Any]:
    # killed after a timeout: then RSS and CPU are lost (0)
    return {**c.measures(pr), "killed_after_timeout": pr.timed_out}


def run_client(entry: Entry, p: dict[str, Any], nsqd: c.Nsqd, topic: str) -> dict[str, Any]:
    client = c.CLIENTS[entry.client]
    base, env = c.client_command(client)
    if entry.source:
        env["PYTHONPATH"] = entry.source
    args = ["consume", "--addr", nsqd.tcp, "--topic", topic, "--channel", CHANNEL]
    args += ["--n", str(p["n"]), "--mif", str(p["mif"])]
    if entry.variant:
        args += ["--variant", entry.variant]
    rec: dict[str, Any] = {
        "cmd": shlex.join(
            ([f"PYTHONPATH={c.rel(env['PYTHONPATH'])}"] if "PYTHONPATH" in env else [])
            + [c.rel(x) for x in base]
            + args
        )
    }
    if entry.client == "smartnsq":
        rec["smartnsq_source"] = c.source_digest()
    mp = c.MeasuredProcess(base + args, env=env)
    deadline = mp.t0 + p["timeout"]
    started: dict[str, Any] | None = None
    handled: dict[str, Any] | None = None
    while handled is None and time.monotonic() < deadline:
        line = mp.readline(deadline - time.monotonic())
        if line is None:
            break
        if line.startswith("STARTED "):
            started = json.loads(line[8:])
        elif line.startswith("HANDLED "):
            handled = json.loads(line[8:])
    t_done, ch = (None, None)
    if handled is not None:
        # the driver has handled N; nsqd must agree that every message is FINished
        t_done, ch = wait_drained(nsqd, topic, deadline, 0, 0.002)
    check = final_check(nsqd, topic, p["n"], 0) if t_done else None
    mp.write_line("stop")
    pr = mp.finish()
    rec.update(measures(pr))
    if pr.stderr.strip():
        rec["stderr_tail"] = pr.stderr[-1500:]
    if handled is None or t_done is None:
        ch = nsqd.channel_stats(topic, CHANNEL)
        left = (ch["depth"] + ch["in_flight_count"]) if ch else p["n"]
        why = "HANDLED never printed" if handled is None else "channel never drained"
        rec.update(
            ok=False,
            error=f"{why} within {p['timeout']:g}s (about {p['n'] - left} finished)",
            started=started is not None,
            final_channel=ch,
        )
        return rec
    t_start = float(handled["t_start"])
    rec.update(
        n=p["n"],
        elapsed=round(t_done - t_start, 4),
        rate=p["n"] / (t_done - t_start),
        handled_rate=p["n"] / (float(handled["t_handled"]) - t_start),
        startup_s=round(t_start - mp.t0, 3),
        workload_cpu_s=round(float(handled.get("cpu", 0.0)), 3),
        final_channel=check,
    )
    err = check["error"] if check else "no final check"
    rec["ok"] = not err
    if err:
        rec["error"] = err
    return rec


def run_go(p: dict[str, Any], nsqd: c.Nsqd, topic: str) -> dict[str, Any]:
    args = ["-nsqd-tcp-address", nsqd.tcp, "-topic", topic, "-channel", CHANNEL]
    args += ["-size", "100", "-rdy", str(p["mif"]), "-runfor", f"{p['timeout']:g}s"]
    env = dict(os.environ, GOMAXPROCS="1")
    rec: dict[str, Any] = {"cmd": "GOMAXPROCS=1 bench_reader " + shlex.join(args)}
    mp = c.MeasuredProcess([str(nsqd.bins[GO]), *args], env=env)
    t_start = mp.t0
    t_done, ch = wait_drained(nsqd, topic, t_start + p["timeout"], GO_UNFLUSHED, 0.005)
    check = final_check(nsqd, topic, p["n"], GO_UNFLUSHED) if t_done else None
    mp.signal_client(signal.SIGTERM)  # bench_reader only, so that time -v still reports
    pr = mp.finish()
    rec.update(measures(pr))
    if t_done is None:
        rec.update(ok=False, error="channel never drained", final_channel=ch)
        return rec
    rec.update(
        n=p["n"],
        elapsed=round(t_done - t_start, 4),
        rate=p["n"] / (t_done - t_start),
        workload_cpu_s=round(pr.cpu_s, 3),  # whole process: Go starts in a few ms
        final_channel=check,
        unflushed_in_flight=check["in_flight_count"] if check else None,
    )
    err = check["error"] if check else "no final check"
    rec["ok"] = not err
    if err:
        rec["error"] = err
    return rec


def baseline_ratios(data: dict[str, Any]) -> str:
    """Per-round rate and CPU ratios of each smartnsq row to its @base twin."""
    by = {(r["client"], r["round"]): r for r in data["runs"] if not r.get("error")}
    lines = ["| row | round | rate now/base | client CPU now/base |", "|---|---|---|---|"]
    for (name, rnd), now in sorted(by.items()):
        base = by.get((name + "@base", rnd))
        if base is None or not now.get("rate") or not base.get("rate"):
            continue
        cpu = now["workload_cpu_s"] / base["workload_cpu_s"]
        lines.append(f"| {name} | {rnd} | {now['rate'] / base['rate']:.2f}x | {cpu:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    c.runner_arguments(ap, 3, "smoke run: 1 round, N = 50,000")
    ap.add_argument(
        "--clients",
        default=",".join(DEFAULT),
        help="comma-separated subset of: " + ", ".join(ENTRIES),
    )
    ap.add_argument("--n", type=int, default=None, help="messages per run (default 500,000)")
    ap.add_argument("--python", default="python3", help="interpreter for the peer venvs")
    ap.add_argument(
        "--baseline",
        metavar="CHECKOUT",
        help="also run each smartnsq row with smartnsq imported from this checkout of an"
        " earlier commit (rows NAME@base, interleaved); prints per-round ratios",
    )
    a = c.parse_runner_arguments(ap, argv)
    names = [x for x in a.clients.split(",") if x]
    unknown = [x for x in names if x not in ENTRIES]
    if unknown:
        ap.error(f"unknown clients: {unknown}")
    if a.baseline:
        src = str(Path(a.baseline).resolve())
        for name in [x for x in names if ENTRIES[x].client == "smartnsq"]:
            e = ENTRIES[name]
            ENTRIES[name + "@base"] = Entry(
                name + "@base", e.client, e.variant, e.label + " @ baseline", src
            )
            names.insert(names.index(name) + 1, name + "@base")
    prm = params(a.quick)
    if a.n:
        prm["n"] = a.n

    for name in names:
        if ENTRIES[name].client != GO:
            c.ensure_venv(c.CLIENTS[ENTRIES[name].client], a.python)

    raw = list(sys.argv[1:] if argv is None else argv)
    stamp, out, data = c.new_results("consume", raw, a.quick, a.rounds, prm)
    data["labels"] = {x: ENTRIES[x].label for x in names}
    data["runs"] = []
    data["python_versions"] = {
        x: c.python_version(c.client_command(c.CLIENTS[ENTRIES[x].client])[0][0])
        for x in names
        if ENTRIES[x].client != GO
    }

    with c.benchmark_nsqd(data, out) as nsqd:
        for rnd in range(1, a.rounds + 1):
            k = (rnd - 1) % len(names)
            for name in names[k:] + names[:k]:
                entry = ENTRIES[name]
                topic = re.sub(r"[^A-Za-z0-9_]", "_", f"bench_consume_{name}_{rnd}_{stamp}")
                prefill_s = prefill(nsqd, topic, prm["n"], prm["chunk"])
                time.sleep(0.3)
                la = c.loadavg()
                s0 = c.cpu_snapshot(nsqd.pid)
                if entry.client == GO:
                    rec = run_go(prm, nsqd, topic)
                else:
                    rec = run_client(entry, prm, nsqd, topic)
                rec.update(c.cpu_delta(s0, c.cpu_snapshot(nsqd.pid), rec["cpu_s"]))
                nsqd.delete_topic(topic)
                rec.update(
                    client=name, workload="consume", round=rnd, loadavg=la, prefill_s=prefill_s
                )
                c.save_run(data, out, rec, f"r{rnd} consume {name:14s}")
                time.sleep(0.3)
    data["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    out.write_text(json.dumps(data, indent=1) + "\n")
    c.log(f"wrote {c.rel(out)}")
    if a.baseline:
        print(baseline_ratios(data))
        return 0
    section = summarize.consume_section(data)
    print(section)
    if a.md if a.md is not None else not a.quick:
        c.replace_md_section(c.BENCHMARKS_MD, "Consume", section)
        c.log(f"updated {c.rel(c.BENCHMARKS_MD)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
