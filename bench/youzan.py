"""Youzan HA cluster benchmark: sharded publish and ordered consume with smartnsq.

    python -m bench.youzan [--rounds 3] [--quick] [--n-ordered N] [--cases consume:ordered]
        [--no-md]

One Youzan HA cluster (etcd + 1 nsqlookupd + 2 nsqd, the fork's v0.3.7-HA.1.12.7)
started through ``compat.cluster`` on 127.0.0.1; every client talks to it through
nsqlookupd only.  100-byte bodies.  Two kinds of 4-partition topic, replica 1:

  ordered     ``orderedmulti=true`` (``compat.youzan.create_topic(..., ordered=True)``);
              publishes carry sharding keys (200 keys, round-robin), consumers
              subscribe ordered (SUB_ORDERED, one message in flight per partition)
  unordered   ``multipart=true`` (the fork refuses more partitions than nsqd nodes
              otherwise); publishes carry no key (round-robin over the partitions)

Workloads, each in its own subprocess (bench/drivers/drv_youzan.py) under GNU
``time -v`` for peak RSS:

  pub         sequential publish(), one in flight, N = 20,000 or 5 s
  concurrent  64 tasks calling publish() on one Producer, each with its own keys, 5 s
  mpub        publish_many() batches of 200 (one key a batch), one in flight, 5 s
  consume     N messages pre-filled with publish_many (untimed), then a Consumer with
              an async counting handler, max_in_flight 16 (ordered) / 2500 (unordered),
              timed from just before the Consumer is created to the N-th distinct message;
              ordered: N = 50,000 and the per-partition round trip (median time between
              two handler calls on one partition)

Every round runs each case on a fresh topic (all topics of a round are created
before it), in an order rotated by one per round.  Raw results go to
bench/results/youzan-<time>.json; a full run then rewrites the "Youzan HA
cluster" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bench import common as c

if str(c.ROOT) not in sys.path:
    sys.path.insert(0, str(c.ROOT))

from compat.cluster import Cluster, http_json
from compat.youzan import create_topic, poll

DRIVER = c.DRIVERS / "drv_youzan.py"
SECTION = "Youzan HA cluster"
PARTITIONS = 4
KEYS = 200
CHANNEL = "ch"
KINDS = ("ordered", "unordered")
PUBLISH = ("pub", "concurrent", "mpub")
CASES = [(w, k) for k in KINDS for w in (*PUBLISH, "consume")]
MIF = {"ordered": 16, "unordered": 2500}
T = TypeVar("T")


def params(quick: bool, n_ordered: int | None, n_unordered: int | None) -> dict[str, Any]:
    secs = 1.0 if quick else 5.0
    return {
        "pub": {"n": 2_000 if quick else 20_000, "seconds": 60.0},
        "concurrent": {"n": 1_000_000, "seconds": secs, "tasks": 64},
        "mpub": {"n": 1_000_000, "seconds": secs, "batch": 200},
        "consume": {
            "ordered": {"n": n_ordered or (5_000 if quick else 50_000), "seconds": 300.0},
            "unordered": {"n": n_unordered or (20_000 if quick else 100_000), "seconds": 300.0},
        },
    }


# ---------------------------------------------------------------- cluster
@contextmanager
def youzan_cluster(workdir: Path) -> Iterator[Cluster]:
    cluster = Cluster.start(kind="youzan", dir=workdir, nsqd=2)
    try:
        yield cluster
    finally:
        cluster.stop()


def make_topic(cluster: Cluster, topic: str, kind: str) -> None:
    if kind == "ordered":
        create_topic(
            cluster, topic, partitions=PARTITIONS, replicas=1, ordered=True, channel=CHANNEL
        )
    else:
        create_topic(
            cluster, topic, partitions=PARTITIONS, replicas=1, multipart=True, channel=CHANNEL
        )


@dataclass
class TopicStats:
    partitions: int
    message_count: int
    depth: int
    in_flight: int
    requeued: int
    timed_out: int


def topic_stats(cluster: Cluster, topic: str) -> TopicStats:
    """Summed over every partition on every nsqd (messages, channel depth/in flight)."""
    parts = msgs = depth = infl = req = tmo = 0
    for d in cluster.nsqd:
        q = urllib.parse.urlencode({"format": "json", "topic": topic})
        data = http_json(f"http://{d.http}/stats?{q}", timeout=10.0) or {}
        for t in data.get("topics") or []:
            if t.get("topic_name") != topic:
                continue
            parts += 1
            msgs += int(t.get("message_count", 0))
            for ch in t.get("channels") or []:
                if ch.get("channel_name") == CHANNEL:
                    depth += int(ch.get("depth", 0))
                    infl += int(ch.get("in_flight_count", 0))
                    req += int(ch.get("requeue_count", 0))
                    tmo += int(ch.get("timeout_count", 0))
    return TopicStats(parts, msgs, depth, infl, req, tmo)


def daemons_cpu(cluster: Cluster) -> float:
    """CPU seconds used so far by the cluster's daemons (nsqd, nsqlookupd, etcd)."""
    total = 0.0
    for d in [*cluster.nsqd, *cluster.lookupd, *([cluster.etcd] if cluster.etcd else [])]:
        try:
            st = Path(f"/proc/{d.pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            pass
    return total


# ---------------------------------------------------------------- runs
def driver_cmd(workload: str, lookupd: str, topic: str, args: dict[str, Any]) -> list[str]:
    cmd = [sys.executable, str(DRIVER), workload, "--lookupd", lookupd, "--topic", topic]
    return cmd + [x for k, v in args.items() for x in (f"--{k}", str(v))]


def show_cmd(cmd: list[str]) -> str:
    return shlex.join(["PYTHONPATH=.", *(c.rel(x) for x in cmd)])


def driver_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(c.ROOT)
    return env


def run_case(
    cluster: Cluster, workload: str, kind: str, topic: str, prm: dict[str, Any]
) -> dict[str, Any]:
    lookupd = cluster.lookupd[0].http
    keys = KEYS if kind == "ordered" else 0
    rec: dict[str, Any] = {}
    expected_extra = 0
    if workload == "consume":
        fill = driver_cmd(
            "fill", lookupd, topic, {"keys": keys, "n": prm["n"], "batch": 200, "channel": CHANNEL}
        )
        t0 = time.monotonic()
        pr = c.run_measured(fill, env=driver_env(), timeout=300)
        res = c.parse_result_line(pr.stdout)
        if res is None or res.get("error") or res["n"] != prm["n"]:
            rec.update(ok=False, error=f"fill failed: {res}", stderr_tail=pr.stderr[-1500:])
            return rec

        def filled() -> TopicStats | None:
            s = topic_stats(cluster, topic)
            return s if s.depth >= prm["n"] else None

        st = poll(f"{topic} filled", filled, 30)
        rec["fill_s"] = round(time.monotonic() - t0, 2)
        rec["fill_depth"] = st.depth
        args = {"keys": keys, "n": prm["n"], "seconds": prm["seconds"], "mif": MIF[kind]}
        args["channel"] = CHANNEL
    else:
        args = {"keys": keys, **prm, "partitions": PARTITIONS}
    cmd = driver_cmd(workload, lookupd, topic, args)
    rec["cmd"] = show_cmd(cmd)
    rec["smartnsq_source"] = c.source_digest()
    s0, d0 = c.cpu_snapshot(None), daemons_cpu(cluster)
    pr = c.run_measured(cmd, env=driver_env(), timeout=float(prm["seconds"]) * 2 + 120)
    s1, d1 = c.cpu_snapshot(None), daemons_cpu(cluster)
    wall = s1.t - s0.t
    other = (s1.busy - s0.busy) - (d1 - d0) - (s1.runner - s0.runner) - pr.cpu_s
    rec.update(
        servers_cpu_s=round(d1 - d0, 3),
        other_cpu_frac=round(max(0.0, other) / (wall * (os.cpu_count() or 1)), 3),
    )
    res = c.driver_result(rec, pr)
    if res is None:
        return rec
    err = res.get("error")
    st = topic_stats(cluster, topic)
    rec.update(partitions_seen=st.partitions, nsqd_message_count=st.message_count)
    if workload == "consume":
        rec["handled"] = res.get("handled")
        if "rtt_us" in res:
            rec.update(rtt_us=res["rtt_us"], rtt_us_per_partition=res["rtt_us_per_partition"])
        rec.update(
            depth_after=st.depth,
            in_flight_after=st.in_flight,
            requeue_count=st.requeued,
            timeout_count=st.timed_out,
        )
        if not err and res["n"] != prm["n"]:
            err = f"handled {res['n']} distinct messages of {prm['n']}"
        if not err and (st.depth or st.requeued or st.timed_out):
            err = f"after the run: channel depth {st.depth}, {st.requeued} requeued, "
            err += f"{st.timed_out} timed out"
    else:
        expected_extra = res["n"] + res["warmup"]
        if not err and st.message_count != expected_extra:
            err = f"nsqd counted {st.message_count} messages, driver reported {expected_extra}"
    if not err and st.partitions != PARTITIONS:
        err = f"topic has {st.partitions} partitions in nsqd stats, expected {PARTITIONS}"
    return c.finish_record(rec, err, res["n"], pr.stderr)


# ---------------------------------------------------------------- report
LABEL = {
    "pub": "sequential publish (1 in flight)",
    "concurrent": "concurrent publish, 64 tasks",
    "mpub": "publish_many, batch 200",
    "consume": "consume",
}
KIND_LABEL = {
    "ordered": "ordered topic, 200 sharding keys",
    "unordered": "unordered (multipart) topic, no key",
}


def _cell(rates: list[float]) -> str:
    if not rates:
        return "-"
    return f"{c.fmt_rate(c.median(rates))} [{c.fmt_rate(min(rates))}-{c.fmt_rate(max(rates))}]"


def _classic_smartnsq(md: str) -> dict[str, str]:
    """smartnsq's classic-nsqd medians from the other sections of BENCHMARKS.md, for
    context (empty when they cannot be found)."""
    out: dict[str, str] = {}
    for line in md.splitlines():
        cells = [x.strip() for x in line.strip().strip("|").split("|")]
        if cells and cells[0] == "**smartnsq (asyncio)**" and len(cells) >= 4:
            out["pub"], out["mpub"], out["concurrent"] = (x.split(" [")[0] for x in cells[1:4])
        elif cells and cells[0] == "**smartnsq (asyncio), async handler**" and len(cells) >= 2:
            out["consume"] = cells[1].split(" [")[0]
    return out


def section(data: dict[str, Any], classic: dict[str, str]) -> str:
    runs = [r for r in data["runs"] if r.get("ok")]
    failed = [r for r in data["runs"] if not r.get("ok")]
    m = data["machine"]
    prm = data["params"]

    def rates(w: str, k: str) -> list[float]:
        return [float(r["rate"]) for r in runs if r["workload"] == w and r["kind"] == k]

    def rss(w: str, k: str | None = None) -> str:
        xs = [
            r["max_rss_kb"]
            for r in runs
            if r["workload"] == w and k in (None, r["kind"]) and r.get("max_rss_kb")
        ]
        return c.fmt_mb(max(xs)) if xs else "-"

    def cpu_us(w: str, k: str) -> str:
        xs = [
            r["workload_cpu_s"] / r["n"] * 1e6
            for r in runs
            if r["workload"] == w and r["kind"] == k and r["n"]
        ]
        return f"{c.median(xs):.1f}" if xs else "-"

    lines = [
        f"Measured {data['started']}: {m['nproc']} CPUs ({m['cpu_model']}), {m['memory']} RAM, "
        f"{m['os']}, kernel {m['kernel']}; Youzan nsqd/nsqlookupd {data['server_version']} "
        f"(etcd + 1 nsqlookupd + 2 nsqd); Python {data['python']}.",
        "",
        "Command (from the repository root):",
        "",
        "```",
        data["command"],
        "```",
        "",
        f"{data['rounds']} interleaved round(s); every cell is the **median [min-max]** in "
        "messages per second over 4-partition topics (replica 1), 100-byte bodies, all through "
        "nsqlookupd. Peak RSS is the largest over the row's runs; CPU is the client process's "
        "CPU microseconds per message during the timed part (median over rounds).",
        "",
        "Sharded publish:",
        "",
        "| workload | ordered topic, 200 sharding keys | unordered (multipart) topic, no key "
        "| smartnsq on classic nsqd (Publish, median) | client CPU µs/msg (ordered / unordered) "
        "| peak RSS |",
        "|---|---|---|---|---|---|",
    ]
    for w in PUBLISH:
        lines.append(
            f"| {LABEL[w]} | {_cell(rates(w, 'ordered'))} | {_cell(rates(w, 'unordered'))} "
            f"| {classic.get(w, '-')} | {cpu_us(w, 'ordered')} / {cpu_us(w, 'unordered')} "
            f"| {rss(w)} |"
        )
    n_o, n_u = (prm["consume"][k]["n"] for k in KINDS)
    lines += [
        "",
        "Consume (N pre-filled messages, an `async def` handler that counts; rate = "
        "N / (Consumer creation to the N-th distinct message handled)):",
        "",
        "| topic | subscription | max_in_flight | N | consume msg/s | client CPU µs/msg "
        "| per-partition round trip µs | peak RSS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k in KINDS:
        sub = "SUB_ORDERED (automatic from the topic meta)" if k == "ordered" else "SUB"
        rtts = [float(r["rtt_us"]) for r in runs if r["kind"] == k and "rtt_us" in r]
        lines.append(
            f"| {KIND_LABEL[k]} | {sub} | {MIF[k]} | {prm['consume'][k]['n']:,} "
            f"| {_cell(rates('consume', k))} "
            f"| {cpu_us('consume', k)} "
            f"| {f'{c.median(rtts):.0f}' if rtts else '-'} "
            f"| {rss('consume', k)} |"
        )
    lines += [
        "",
        "Ordered consume is round-trip bound (one message in flight per partition): the "
        "per-partition round trip is the median time between two handler calls on one "
        "partition (FIN out, next message in). Target: ahead of Youzan's Go consumer "
        "(go-nsq v1.7.2-HA, `EnableOrdered`, the same N keyed messages over 4 partitions "
        "from the same cluster), which is measured by hand (the fork's Go client is not "
        "fetched or built by this project).",
    ]
    if "consume" in classic:
        lines += [
            "",
            f"For context, smartnsq's async-handler consume from one classic nsqd (section "
            f"Consume, 500,000 messages, max_in_flight 2500): {classic['consume']} msg/s "
            "(median).",
        ]
    extra = {
        k: sorted(
            {
                int(r["handled"]) - int(r["n"])
                for r in runs
                if r["workload"] == "consume" and r["kind"] == k and r.get("handled") is not None
            }
        )
        for k in KINDS
    }
    lines += [
        "",
        "Redeliveries seen by the handler (handler calls - N, per run): ordered "
        f"{', '.join(map(str, extra['ordered'])) or '-'}; unordered "
        f"{', '.join(map(str, extra['unordered'])) or '-'}.",
    ]
    if any(extra["ordered"]):
        lines[-1] += (
            " When this benchmark was written, the ordered ones were the first message of "
            "each partition, delivered twice right after SUB_ORDERED (same id and offset, "
            'attempts 1); nsqd answers the second FIN with `E_FIN_FAILED` ("Message ID not '
            'in flight") and the consumer goes on normally.'
        )
    digests = sorted({r["smartnsq_source"] for r in data["runs"] if r.get("smartnsq_source")})
    others = [float(r["other_cpu_frac"]) for r in data["runs"] if "other_cpu_frac" in r]
    if others:
        lines += [
            "",
            f"Median share of the {m['nproc']} cores used by other jobs during a run "
            f"(`/proc/stat` minus client, cluster daemons and runner): {c.median(others):.2f} "
            f"(max {max(others):.2f}).",
        ]
    lines += ["", f"smartnsq at git {data['git']}, source digest {', '.join(digests)}."]
    if len(digests) > 1:
        lines[-1] += (
            f" **Warning: the smartnsq sources changed during this invocation "
            f"({len(digests)} versions); rerun for consistent figures.**"
        )
    if failed:
        lines += ["", f"**{len(failed)} run(s) failed and are not counted:**", ""]
        lines += [
            f"- round {r['round']} {r['workload']} {r['kind']}: {r.get('error')}" for r in failed
        ]
    lines += [
        "",
        "Method:",
        "",
        '- `compat.cluster.Cluster.start(kind="youzan", nsqd=2)`: a private etcd (v2 API), '
        "one nsqlookupd and two HA nsqd with their default (disk-backed) queues, all on "
        "127.0.0.1. Each run gets a fresh topic: ordered ones through "
        "`compat.youzan.create_topic(..., partitions=4, replicas=1, ordered=True, "
        'channel="ch")`, unordered ones with `multipart=true` (the fork refuses an unordered '
        "topic with more partitions than nsqd nodes otherwise; `create_topic` has no option "
        "for it, so `bench/youzan.py` creates it the same way). The 4 partitions are spread "
        "over the 2 nsqd; all topics of a round are created (and writable, channel `ch` "
        "present) before the round starts.",
        "- Each run is its own subprocess, `bench/drivers/drv_youzan.py`, with the benchmark's "
        "interpreter and the working tree on PYTHONPATH, under GNU `time -v` for peak RSS "
        "(MB = 10^6 bytes). `Producer(lookupd_http_addresses=[lookupd])` and "
        '`Consumer(topic, "ch", handler, lookupd_http_addresses=[lookupd], max_in_flight=M)`.',
        "- Publish: the driver first publishes one untimed message to every partition "
        "(`partition=p`, so every partition leader is connected), then times the workload: "
        f"sequential `publish(topic, body, sharding_key=key)` over 200 keys round-robin, "
        f"N = {prm['pub']['n']:,}; 64 tasks on one Producer, task *j* cycling over its own "
        "keys *j*, *j*+64, ... (3-4 keys each), for "
        f"{prm['concurrent']['seconds']:g} s; `publish_many(topic, 200 bodies, "
        f"sharding_key=key)` with the key changing every batch, one batch in flight, for "
        f"{prm['mpub']['seconds']:g} s. On the unordered topic the same calls carry no "
        "key and the Producer spreads them round-robin over the partitions. The runner "
        "checks that the topic's `message_count`, summed over the 4 partitions in both "
        "nsqd's `/stats`, equals warm-up + timed messages.",
        "- Consume: before the run (untimed) the driver's `fill` mode publishes the N "
        f"({n_o:,} ordered, {n_u:,} unordered; more for the unordered topic so that "
        "the start-up does not dominate) messages with `publish_many` batches of 200 "
        "(ordered: one of the 200 sharding keys a batch; unordered: round-robin) and the "
        "runner waits until the channel depth summed over the partitions is N. The consume "
        "driver notes the time just before it creates its Consumer "
        "(lookup, connect, IDENTIFY and SUB included) and stops the clock when the handler "
        "has seen N distinct messages (on the ordered topic a message whose offset is not "
        "above the last one seen on its partition is a redelivery and not counted again); "
        "the handler returns normally (FIN). The runner then checks in both nsqd's `/stats` "
        "that the channel has depth 0, `requeue_count` 0 and `timeout_count` 0 on every "
        "partition. On "
        "the ordered topic the server delivers one message per partition at a time, so "
        "this is bound by round trips (at most 4 messages in flight over the 4 partitions, "
        "whatever max_in_flight), not by the client's CPU.",
        "- Round *r* runs the 8 cases (3 publish workloads + consume, on both topic kinds) "
        "rotated by *r-1*. Raw per-run JSON (exact commands, rates, CPU seconds, RSS, stats "
        "checks) in `bench/results/youzan-*.json`.",
        "- There is no Python peer client that speaks the fork's protocol extensions, so "
        "there is no peer comparison; the classic-nsqd column repeats smartnsq's medians "
        "from the Publish section for context only (one classic nsqd with an in-memory "
        "queue, no lookupd, no partitions).",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    c.runner_arguments(ap, 3, "short smoke run (1 round, 1 s runs)")
    ap.add_argument("--n-ordered", type=int, default=None, help="messages to consume (ordered)")
    ap.add_argument("--n-unordered", type=int, default=None, help="(unordered) default 100,000")
    ap.add_argument(
        "--cases",
        default="",
        help="only these WORKLOAD:KIND cases, comma-separated (e.g. consume:ordered)",
    )
    a = c.parse_runner_arguments(ap, argv)
    args = sys.argv[1:] if argv is None else argv
    prm = params(a.quick, a.n_ordered, a.n_unordered)
    cases = [tuple(x.split(":", 1)) for x in a.cases.split(",") if x] or CASES
    unknown = [x for x in cases if x not in CASES]
    if unknown:
        ap.error(f"unknown cases {unknown}; known: {[':'.join(x) for x in CASES]}")

    stamp, out, data = c.new_results("youzan", list(args), a.quick, a.rounds, prm)
    data["python"] = c.python_version(sys.executable)
    data["runs"] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-youzan-") as workdir,
        youzan_cluster(Path(workdir)) as cluster,
    ):
        d0 = cluster.nsqd[0]
        data["server_version"] = (http_json(f"http://{d0.http}/info", timeout=5.0) or {}).get(
            "version", "?"
        )
        c.log(f"youzan cluster: lookupd {cluster.lookupd[0].http}; results -> {c.rel(out)}")
        for rnd in range(1, a.rounds + 1):
            k = (rnd - 1) % len(cases)
            order = cases[k:] + cases[:k]
            topics = {case: f"bench_yz_{case[0]}_{case[1]}_{rnd}_{stamp}" for case in order}
            t0 = time.monotonic()
            with ThreadPoolExecutor(len(topics)) as pool:
                for f in [pool.submit(make_topic, cluster, t, ck[1]) for ck, t in topics.items()]:
                    f.result()
            c.log(f"r{rnd}: {len(topics)} topics created in {time.monotonic() - t0:.1f} s")
            for wl, kind in order:
                topic = topics[(wl, kind)]
                la = c.loadavg()
                p = prm[wl][kind] if wl == "consume" else prm[wl]
                rec = run_case(cluster, wl, kind, topic, p)
                rec.update(workload=wl, kind=kind, round=rnd, topic=topic, loadavg=la)
                c.save_run(data, out, rec, f"r{rnd} {wl:10s} {kind:9s}")
                time.sleep(0.3)
    data["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    out.write_text(json.dumps(data, indent=1) + "\n")
    c.log(f"wrote {c.rel(out)}")
    classic = _classic_smartnsq(c.BENCHMARKS_MD.read_text()) if c.BENCHMARKS_MD.exists() else {}
    body = section(data, classic)
    print(body)
    if a.md if a.md is not None else not a.quick:
        c.replace_md_section(c.BENCHMARKS_MD, SECTION, body)  # re-reads the file first
        c.log(f"updated {c.rel(c.BENCHMARKS_MD)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
