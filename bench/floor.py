"""Publish floor: how fast a batch can go on each event loop before any client-library work.

    python -m bench.floor [--rounds 9] [--quick]

MPUB batches of 200 x 100-byte bodies, one batch in flight, 1,000,000 messages or 5 s, against
one classic nsqd, interleaved and rotated per round like ``bench.publish``:

  bench_writer      Go, GOMAXPROCS=1, one connection (the Publish section's ceiling)
  smartnsq          Producer.publish_many on asyncio's loop, and on uvloop
  floor-*           ``drivers/drv_floor.py``: the same pre-built MPUB from a blocking socket,
                    from an asyncio Protocol callback, and from a task awaiting a future

The floor clients skip everything a library has to do (checking and encoding the bodies,
IDENTIFY, matching answers to requests, timeouts), so they show what the event loop alone
leaves of bench_writer's rate. Raw results go to bench/results/floor-<time>.json; a full run
rewrites the "Publish floor" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from bench import common as c
from bench import publish
from bench import summarize as s

SECTION = "Publish floor"
FLOOR = {
    x.name: x
    for x in [
        c.Client(
            "floor-blocking",
            "drv_floor.py",
            (),
            frozenset({"mpub"}),
            "no library: blocking socket, pre-built MPUB",
            "blocking",
        ),
        c.Client(
            "floor-callback",
            "drv_floor.py",
            (),
            frozenset({"mpub"}),
            "no library: asyncio Protocol writing the next MPUB from `data_received`",
            "callback",
        ),
        c.Client(
            "floor-future",
            "drv_floor.py",
            (),
            frozenset({"mpub"}),
            "no library: asyncio Protocol + a future awaited by a task",
            "future",
        ),
    ]
}
CLIENTS = {**{x: c.CLIENTS[x] for x in ("smartnsq", "smartnsq-uvloop")}, **FLOOR}


def section(data: dict[str, Any]) -> str:
    runs: list[dict[str, Any]] = data["runs"]
    go = s._rates(runs, s.GO, "mpub")
    out = s._preamble(data)
    out += [
        f"{data['rounds']} interleaved round(s) of MPUB batches of 200 x 100 bytes, one batch in "
        "flight; cells are the **median [min-max]** in messages per second, ratios the median "
        "over rounds of the per-round ratio to `bench_writer`.",
        "",
        "| client | publish_many / MPUB, batch 200 | vs `bench_writer -batch-size 200` |",
        "|---|---|---|",
    ]
    for name, client in CLIENTS.items():
        rates = s._rates(runs, name, "mpub")
        label = f"**{client.label}**" if name.startswith("smartnsq") else client.label
        out.append(f"| {label} | {s._cell(rates)} | {s._fmt_ratio(s._ratio(rates, go))} |")
    out.append(
        f"| Go `bench_writer`, GOMAXPROCS=1, 1 connection (ceiling) | {s._cell(go)} | 1.00x |"
    )
    failures = [r for r in runs if not r.get("ok")]
    if failures:
        out += ["", "Failed runs (not counted):", ""]
        out += [f"- r{r['round']} {r['client']}: {r.get('error', '?')}" for r in failures]
    out += [
        "",
        "- The `no library` rows are `bench/drivers/drv_floor.py`: one MPUB built once, then "
        "sent again and again; no IDENTIFY, no checks on the bodies, no request bookkeeping. "
        "They are not clients anyone should use; they bound what any client can reach on that "
        "kind of loop, before doing a library's work.",
        "- The gap between the blocking row and the asyncio rows is what asyncio's pure-Python "
        "loop costs per round trip on this machine. smartnsq resumes an answered publish inside "
        "the read callback, as the `callback` row writes from it, but it also checks and "
        "encodes the 200 bodies before each send, which none of these rows do.",
        "- Same nsqd, topics, process measurement and count check as the Publish section; "
        f"`python -m bench.floor` writes `bench/results/floor-*.json`. smartnsq at git "
        f"{data['git']}.",
    ]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    c.runner_arguments(ap, 9, "short smoke run (1 round, 1 s runs)")
    a = c.parse_runner_arguments(ap, argv)
    prm = publish.params(a.quick)
    names = [*CLIENTS, s.GO]
    stamp, out, data = c.new_results("floor", list(argv or sys.argv[1:]), a.quick, a.rounds, prm)
    data["runs"] = []
    data["python_versions"] = {"smartnsq": c.python_version(sys.executable)}
    with c.benchmark_nsqd(data, out) as nsqd:
        for rnd in range(1, a.rounds + 1):
            k = (rnd - 1) % len(names)
            for name in names[k:] + names[:k]:
                client = None if name == s.GO else CLIENTS[name]
                rec = publish.fresh_topic_run(
                    nsqd, client, "mpub", prm, f"floor_{name}_{rnd}_{stamp}"
                )
                rec.update(client=name, workload="mpub", round=rnd)
                c.save_run(data, out, rec, f"r{rnd} {name:15s}")
                time.sleep(0.3)
    data["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    out.write_text(json.dumps(data, indent=1) + "\n")
    body = section(data)
    print(body)
    if a.md if a.md is not None else not a.quick:
        c.replace_md_section(c.BENCHMARKS_MD, SECTION, body)
        c.log(f"updated {c.rel(c.BENCHMARKS_MD)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
