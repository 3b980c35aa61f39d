"""Publish benchmark: smartnsq vs peer Python clients vs nsqd's bench_writer.

    python -m bench.publish [--rounds 3] [--quick] [--clients a,b] [--workloads pub,mpub]

Workloads (100-byte bodies, one classic nsqd v1.3.0 on 127.0.0.1):
  pub         one PUB per round trip, N = 20,000 (ceiling: bench_writer -batch-size 1)
  mpub        publish_many / MPUB batches of 200, one in flight, 5 s or 1,000,000
              messages (ceiling: bench_writer -batch-size 200)
  concurrent  64 tasks calling publish() on one producer, 5 s or 1,000,000 messages
              (smartnsq, and pynsq whose callback API pipelines naturally)

Every round runs each workload for every client in an order rotated by one per
round.  Raw results go to bench/results/publish-<time>.json; a full run then
rewrites the "Publish" section of BENCHMARKS.md (see bench.summarize).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
from typing import Any

from bench import common as c
from bench import summarize

GO = "bench_writer"
WORKLOADS = ("pub", "mpub", "concurrent")
GO_BATCH = {"pub": 1, "mpub": 200}  # the ceiling for each workload


def params(quick: bool) -> dict[str, dict[str, Any]]:
    secs = 1.0 if quick else 5.0
    return {
        "pub": {"n": 2_000 if quick else 20_000, "seconds": 60.0},
        "mpub": {"n": 1_000_000, "seconds": secs, "batch": 200},
        "concurrent": {"n": 1_000_000, "seconds": secs, "tasks": 64},
        "go": {"runfor": f"{secs:g}s"},
    }


def run_client(
    client: c.Client, workload: str, p: dict[str, Any], nsqd: c.Nsqd, topic: str
) -> dict[str, Any]:
    base, env = c.client_command(client)
    args = [workload, "--addr", nsqd.tcp, "--topic", topic]
    args += [x for k, v in p.items() for x in (f"--{k}", str(v))]
    if client.variant:
        args += ["--variant", client.variant]
    cmd = base + args
    rec: dict[str, Any] = {
        "cmd": shlex.join(
            ([f"PYTHONPATH={c.rel(env['PYTHONPATH'])}"] if "PYTHONPATH" in env else [])
            + [c.rel(x) for x in base]
            + args
        )
    }
    if client.name.startswith("smartnsq"):
        rec["smartnsq_source"] = c.source_digest()
    pr = c.run_measured(cmd, env=env, timeout=float(p["seconds"]) * 2 + 120)
    res = c.driver_result(rec, pr)
    if res is None:
        return rec
    count = nsqd.message_count(topic)
    rec["nsqd_message_count"] = count
    err = res.get("error")
    if not err and count != res["n"] + res["warmup"]:
        err = f"nsqd counted {count} messages, driver reported {res['n']} + {res['warmup']}"
    return c.finish_record(rec, err, res["n"], pr.stderr)


def run_go(workload: str, p: dict[str, Any], nsqd: c.Nsqd, topic: str) -> dict[str, Any]:
    args = [
        "-nsqd-tcp-address",
        nsqd.tcp,
        "-topic",
        topic,
        "-size",
        "100",
        "-batch-size",
        str(GO_BATCH[workload]),
        "-runfor",
        p["runfor"],
    ]
    env = dict(os.environ, GOMAXPROCS="1")
    rec: dict[str, Any] = {"cmd": "GOMAXPROCS=1 bench_writer " + shlex.join(args)}
    pr = c.run_measured([str(nsqd.bins["bench_writer"]), *args], env=env, timeout=120)
    rec.update(c.measures(pr))
    m = c.GO_RATE.search(pr.stderr + pr.stdout)
    if pr.returncode != 0 or not m:
        rec.update(ok=False, error=f"exit {pr.returncode}", stderr_tail=pr.stderr[-1500:])
        return rec
    count = nsqd.message_count(topic)
    rec.update(
        ok=True, rate=float(m.group(2)), duration=m.group(1), n=count, nsqd_message_count=count
    )
    return rec


def fresh_topic_run(
    nsqd: c.Nsqd, client: c.Client | None, workload: str, prm: dict[str, Any], topic: str
) -> dict[str, Any]:
    """One run of ``client`` (None: bench_writer) on a new topic, with nsqd's CPU meanwhile."""
    topic = re.sub(r"[^A-Za-z0-9_]", "_", topic)
    nsqd.delete_topic(topic)
    nsqd.create_topic(topic)
    la = c.loadavg()
    s0 = c.cpu_snapshot(nsqd.pid)
    if client is None:
        rec = run_go(workload, prm["go"], nsqd, topic)
    else:
        rec = run_client(client, workload, prm[workload], nsqd, topic)
    rec.update(c.cpu_delta(s0, c.cpu_snapshot(nsqd.pid), rec["cpu_s"]))
    nsqd.delete_topic(topic)
    rec["loadavg"] = la
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    c.runner_arguments(ap, 3, "short smoke run (1 round, 1 s runs)")
    ap.add_argument(
        "--clients",
        default=",".join([*c.CLIENTS, GO]),
        help="comma-separated subset of: " + ", ".join([*c.CLIENTS, GO]),
    )
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--python", default="python3", help="interpreter for the peer venvs")
    a = c.parse_runner_arguments(ap, argv)
    names = [x for x in a.clients.split(",") if x]
    workloads = [w for w in a.workloads.split(",") if w]
    unknown = [x for x in names if x != GO and x not in c.CLIENTS]
    if unknown or not set(workloads) <= set(WORKLOADS):
        ap.error(f"unknown clients/workloads: {unknown} {workloads}")
    prm = params(a.quick)

    for name in names:
        if name != GO:
            c.ensure_venv(c.CLIENTS[name], a.python)

    stamp, out, data = c.new_results("publish", list(argv or sys.argv[1:]), a.quick, a.rounds, prm)
    data["runs"] = []
    pythons = {}
    for name in names:
        if name != GO:
            py = c.client_command(c.CLIENTS[name])[0][0]
            pythons[name] = c.python_version(py)
    data["python_versions"] = pythons

    with c.benchmark_nsqd(data, out) as nsqd:
        for rnd in range(1, a.rounds + 1):
            k = (rnd - 1) % len(names)
            order = names[k:] + names[:k]
            for wl in workloads:
                for name in order:
                    if name == GO:
                        if wl not in GO_BATCH:
                            continue
                    elif wl not in c.CLIENTS[name].workloads:
                        continue
                    client = None if name == GO else c.CLIENTS[name]
                    rec = fresh_topic_run(nsqd, client, wl, prm, f"bench_{wl}_{name}_{rnd}_{stamp}")
                    rec.update(client=name, workload=wl, round=rnd)
                    c.save_run(data, out, rec, f"r{rnd} {wl:10s} {name:12s}")
                    time.sleep(0.3)
    data["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    out.write_text(json.dumps(data, indent=1) + "\n")
    c.log(f"wrote {c.rel(out)}")
    print(summarize.publish_section(data))
    if a.md if a.md is not None else not a.quick:
        c.replace_md_section(c.BENCHMARKS_MD, "Publish", summarize.publish_section(data))
        c.log(f"updated {c.rel(c.BENCHMARKS_MD)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
