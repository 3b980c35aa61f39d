"""Latency benchmark: publish call to handler entry, smartnsq vs go-nsq v1.1.0 vs pynsq.

One classic nsqd (started with ``--min-output-buffer-timeout=1ms`` so that the low-latency
setting is allowed). For each offered rate (open loop: a paced publisher that never waits for
the consumer) and each buffer setting (``default``: nsqd's 250 ms output buffer timeout;
``low``: output_buffer_timeout 1 ms), every client runs a consumer process and then a
publisher process of its own library on a fresh topic; the consumer records, on handler
entry, CLOCK_MONOTONIC minus the stamp the publisher put in the 100-byte body right before
its publish call. Runs are interleaved: round r rotates the client order by r-1 inside every
(rate, setting) block.

With ``--feed pipe`` no publisher paces itself: ``bench.metronome``, one clock for every
client, writes a byte to the publisher's stdin as each message falls due (``--arrivals``:
``poisson``, the default, or ``constant``), and the publisher publishes what it reads. That
takes each runtime's timer rounding out of the comparison.

    python -m bench.latency [--rounds 3] [--rates 1000,10000,50000] [--seconds 20]
                            [--warmup 2] [--clients ...] [--settings default,low]
                            [--feed timer|pipe] [--arrivals poisson|constant]
                            [--quick] [--md/--no-md]

Raw results: bench/results/latency-<time>.json; a full run rewrites "## Latency" (with
``--feed pipe``: "## Latency, one clock for every publisher") in BENCHMARKS.md
(``python -m bench.summarize FILE`` regenerates it).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from array import array
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import common as c
from bench.gobuild import ensure_nsqgo

LOW_MS = 1
NSQD_EXTRA = ["--min-output-buffer-timeout=1ms"]
SETTINGS = {"default": 0, "low": LOW_MS}


@dataclass(frozen=True)
class Row:
    name: str
    label: str
    client: str  # bench.common client whose venv runs the driver; "" for Go
    driver: str
    variant: str = ""
    pub: str = ""  # another row whose publisher this one uses (a mixed pair), else its own


ROWS = {
    r.name: r
    for r in [
        Row("smartnsq", "smartnsq (asyncio)", "smartnsq", "lat_smartnsq.py"),
        Row("smartnsq-uvloop", "smartnsq (uvloop)", "smartnsq", "lat_smartnsq.py", "uvloop"),
        Row("smartnsq-sync", "smartnsq.sync (blocking)", "smartnsq", "lat_smartnsq.py", "blocking"),
        Row("go-nsq", "go-nsq v1.1.0, GOMAXPROCS=1", "", ""),
        Row("go-nsq-2", "go-nsq v1.1.0, GOMAXPROCS=2", "", "", "2"),
        Row("pynsq", "pynsq 0.9.1 (tornado)", "pynsq", "lat_pynsq.py"),
        # Mixed pairs: which side of a pair sets its latency.
        Row(
            "mix-go-pub",
            "mixed: smartnsq (asyncio) consumer, go-nsq publisher",
            "smartnsq",
            "lat_smartnsq.py",
            pub="go-nsq",
        ),
        Row(
            "mix-go-pub-uvloop",
            "mixed: smartnsq (uvloop) consumer, go-nsq publisher",
            "smartnsq",
            "lat_smartnsq.py",
            "uvloop",
            pub="go-nsq",
        ),
        Row(
            "diag-tsleep",
            "diagnostic: smartnsq (asyncio), publisher paced by time.sleep",
            "smartnsq",
            "lat_smartnsq.py",
            "tsleep",
        ),
        Row(
            "mix-go-sub",
            "mixed: go-nsq consumer, smartnsq (asyncio) publisher",
            "",
            "",
            pub="smartnsq",
        ),
    ]
}
PERCENTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("p99.9", 0.999), ("max", 1.0))


def percentiles(lat: array[int]) -> dict[str, float]:
    """Nearest-rank percentiles in milliseconds."""
    s = sorted(lat)
    if not s:
        return {}
    return {k: s[min(len(s) - 1, max(0, int(q * len(s) + 0.5) - 1))] / 1e6 for k, q in PERCENTILES}


def commands(
    row: Row, role: str, nsqgo: Path, args: dict[str, Any]
) -> tuple[list[str], dict[str, str]]:
    if not row.client:
        env = dict(os.environ, GOMAXPROCS=row.variant or "1")
        cmd = [str(nsqgo), role, "-addr", args["addr"], "-topic", args["topic"]]
        if role == "pub":
            cmd += ["-rate", str(args["rate"]), "-warmup", str(args["warmup"])]
            cmd += ["-seconds", str(args["seconds"])]
            cmd += ["-feed"] if args["feed"] == "pipe" else []
        else:
            cmd += ["-channel", args["channel"], "-mif", str(args["mif"]), "-out", args["out"]]
            if args["obt_ms"]:
                cmd += ["-output-buffer-timeout", f"{args['obt_ms']}ms"]
        return cmd, env
    base, env = c.client_command(c.CLIENTS[row.client])
    cmd = [base[0], str(c.DRIVERS / row.driver), role, "--addr", args["addr"]]
    cmd += ["--topic", args["topic"], "--variant", row.variant]
    if role == "pub":
        cmd += ["--rate", str(args["rate"]), "--warmup", str(args["warmup"])]
        cmd += ["--seconds", str(args["seconds"])]
        cmd += ["--feed"] if args["feed"] == "pipe" else []
    else:
        cmd += ["--channel", args["channel"], "--mif", str(args["mif"]), "--out", args["out"]]
        cmd += ["--obt-ms", str(args["obt_ms"])]
    return cmd, env


def wait_for(pred: Any, timeout: float, step: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return False


def publish(
    cmd: list[str], env: dict[str, str], rate: int, a: argparse.Namespace
) -> tuple[c.ProcResult, dict[str, Any] | None]:
    """Run the publisher to its end; with ``--feed pipe``, fed by ``bench.metronome``, whose
    figures (lateness, CPU seconds) are returned too."""
    timeout = a.warmup + a.seconds + 120
    if a.feed != "pipe":
        return c.run_measured(cmd, env=env, timeout=timeout), None
    with tempfile.NamedTemporaryFile("r", prefix="metronome-", suffix=".json") as stats:
        metro = [sys.executable, "-m", "bench.metronome", "--rate", str(rate)]
        metro += ["--warmup", str(a.warmup), "--seconds", str(a.seconds)]
        metro += ["--arrivals", a.arrivals, "--seed", str(rate), "--stats", stats.name]
        m = subprocess.Popen(metro, cwd=c.ROOT, stdout=subprocess.PIPE)
        assert m.stdout is not None
        try:
            pr = c.run_measured(cmd, env=env, timeout=timeout, stdin=m.stdout)
        finally:
            m.stdout.close()
            _, status, ru = os.wait4(m.pid, 0)
            m.returncode = os.waitstatus_to_exitcode(status)
        figures = json.loads(stats.read() or "{}")
    if m.returncode != 0 or not figures:
        if pr.returncode == 0:
            raise RuntimeError(f"metronome: exit {m.returncode}")
        return pr, None  # the publisher's own failure says more
    figures["cpu_s"] = ru.ru_utime + ru.ru_stime
    return pr, figures


def run_one(
    nsqd: c.Nsqd, nsqgo: Path, row: Row, rate: int, setting: str, a: argparse.Namespace
) -> dict[str, Any]:
    topic = f"lat_{row.name.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
    channel = "lat"
    rec: dict[str, Any] = {"client": row.name, "rate": rate, "setting": setting, "ok": False}
    nsqd.create_topic(topic)
    nsqd.create_channel(topic, channel)
    with tempfile.NamedTemporaryFile(prefix="lat-", suffix=".bin") as out:
        args = {
            "addr": nsqd.tcp,
            "topic": topic,
            "channel": channel,
            "rate": rate,
            "warmup": a.warmup,
            "seconds": a.seconds,
            "mif": a.mif,
            "obt_ms": SETTINGS[setting],
            "out": out.name,
            "feed": a.feed,
        }
        scmd, senv = commands(row, "sub", nsqgo, args)
        pcmd, penv = commands(ROWS[row.pub] if row.pub else row, "pub", nsqgo, args)
        rec["cmd"] = {"sub": shlex.join(scmd), "pub": shlex.join(pcmd)}
        sub = c.MeasuredProcess(scmd, env=senv)
        try:
            line = sub.readline(30)
            while line is not None and not line.startswith("READY"):
                line = sub.readline(30)
            if line is None:
                raise RuntimeError("consumer never printed READY")

            def subscribed() -> bool:
                ch = nsqd.channel_stats(topic, channel, clients=True)
                return bool(ch and ch.get("clients"))

            if not wait_for(subscribed, 20):
                raise RuntimeError("consumer never subscribed")
            snap0 = c.cpu_snapshot(nsqd.pid)
            pr, metronome = publish(pcmd, penv, rate, a)
            res = c.parse_result_line(pr.stdout)
            if res is None or res.get("error"):
                why = res.get("error") if res else f"exit {pr.returncode}"
                raise RuntimeError(f"publisher: {why}: {pr.stderr[-800:]}")

            def drained() -> bool:
                ch = nsqd.channel_stats(topic, channel)
                return ch is not None and ch["depth"] == 0 and ch["in_flight_count"] == 0

            # A consumer that cannot keep up gets a bounded time to catch up; what it has not
            # received by then makes the run "overloaded" (its percentiles are lower bounds).
            rec["drained"] = wait_for(drained, max(10.0, a.seconds), 0.1)
            snap1 = c.cpu_snapshot(nsqd.pid)
            if metronome is not None and res["n"] != int(a.seconds * rate):
                raise RuntimeError(f"publisher read {res['n']} of {int(a.seconds * rate)}")
            rec["metronome"] = metronome
            total = res["n"] + res["warmup"]
            rec.update(
                n=res["n"],
                pub_cpu_us=res["cpu"] / max(1, res["n"]) * 1e6,
                pub_lag_max_ms=res["lag_max_ms"],
                pub_batches=res.get("batches"),
                pub_elapsed=res["elapsed"],
                pub_rss_kb=pr.max_rss_kb,
            )
            feed_cpu = metronome["cpu_s"] if metronome else 0.0
            rec.update(c.cpu_delta(snap0, snap1, pr.cpu_s + feed_cpu))
            rec["nsqd_cpu_us"] = rec.get("nsqd_cpu_s", 0.0) / max(1, total) * 1e6
        except Exception as e:
            rec["error"] = str(e)
        finally:
            if sub.proc.stdin is not None:
                with suppress(OSError):
                    sub.proc.stdin.close()
            spr = sub.finish(timeout=30)
        sres = c.parse_result_line(spr.stdout)
        rec["sub_rss_kb"] = spr.max_rss_kb
        if sres is not None and "error" not in rec:
            lat: array[int] = array("q")
            data = Path(out.name).read_bytes()
            lat.frombytes(data[: len(data) // 8 * 8])
            rec["received"] = len(lat)
            rec["sub_cpu_us"] = sres["cpu"] / max(1, len(lat)) * 1e6
            rec.update(percentiles(lat))
            rec["ok"] = bool(lat)
            rec["overloaded"] = len(lat) < rec.get("n", 0)
        elif "error" not in rec:
            rec["error"] = f"consumer: exit {spr.returncode}: {spr.stderr[-800:]}"
        if spr.stderr.strip() and not rec["ok"]:
            rec["sub_stderr_tail"] = spr.stderr[-800:]
    nsqd.delete_topic(topic)
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__)
    c.runner_arguments(ap, 3, "1 round, 3 s per rate after 1 s of warm-up")
    ap.add_argument("--rates", default="1000,10000,50000")
    ap.add_argument("--seconds", type=float, default=None, help="timed seconds per run (20)")
    ap.add_argument("--warmup", type=float, default=None, help="warm-up seconds per run (2)")
    ap.add_argument(  # diagnostic rows only when named
        "--clients", default=",".join(n for n in ROWS if not n.startswith("diag-"))
    )
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--mif", type=int, default=2500, help="max_in_flight of every consumer")
    ap.add_argument(
        "--feed",
        choices=("timer", "pipe"),
        default="timer",
        help="timer: each publisher paces itself with its runtime's sleep; pipe: one shared "
        "clock (bench.metronome) wakes every publisher through its stdin",
    )
    ap.add_argument(
        "--arrivals",
        choices=("constant", "poisson"),
        default="poisson",
        help="the shared clock's schedule (--feed pipe only)",
    )
    a = c.parse_runner_arguments(ap, argv)
    a.seconds = a.seconds if a.seconds is not None else (3.0 if a.quick else 20.0)
    a.warmup = a.warmup if a.warmup is not None else (1.0 if a.quick else 2.0)
    rates = [int(float(x)) for x in a.rates.split(",")]
    rows = [ROWS[x] for x in a.clients.split(",")]
    settings = a.settings.split(",")
    for r in rows + [ROWS[r.pub] for r in rows if r.pub]:
        if r.client:
            c.ensure_venv(c.CLIENTS[r.client])
    nsqgo = ensure_nsqgo()
    params = {
        "rates": rates,
        "seconds": a.seconds,
        "warmup": a.warmup,
        "settings": {s: SETTINGS[s] for s in settings},
        "mif": a.mif,
        "feed": a.feed,
        "arrivals": a.arrivals if a.feed == "pipe" else "constant",
        "clients": [r.name for r in rows],
        "labels": {r.name: r.label for r in rows},
        "nsqd_args": [*c.NSQD_ARGS, *NSQD_EXTRA],
        "source_digest": c.source_digest(),
    }
    _, out, data = c.new_results(
        "latency", list(argv if argv is not None else sys.argv[1:]), a.quick, a.rounds, params
    )
    data["runs"] = []
    with c.benchmark_nsqd(data, out, NSQD_EXTRA) as nsqd:
        for rnd in range(1, a.rounds + 1):
            for rate in rates:
                for setting in settings:
                    k = (rnd - 1) % len(rows)
                    for row in rows[k:] + rows[:k]:
                        rec = run_one(nsqd, nsqgo, row, rate, setting, a)
                        rec["round"] = rnd
                        data["runs"].append(rec)
                        out.write_text(json.dumps(data, indent=1) + "\n")
                        lag_ms = rec.get("pub_lag_max_ms")  # None: fed, no schedule of its own
                        lag = "-" if lag_ms is None else f"{lag_ms:.1f} ms"
                        c.log(
                            f"r{rnd} {rate:>6} {setting:<7} {row.name:<16} "
                            + (
                                f"p50 {rec['p50']:.2f} p99 {rec['p99']:.2f} "
                                f"p99.9 {rec['p99.9']:.2f} max {rec['max']:.2f} ms  "
                                f"cpu pub/sub/nsqd {rec['pub_cpu_us']:.1f}/"
                                f"{rec['sub_cpu_us']:.1f}/{rec['nsqd_cpu_us']:.1f} us  "
                                f"lag {lag}  "
                                f"other {rec.get('other_cpu_frac', -1):.2f}"
                                + (
                                    f"  OVERLOADED ({rec['received']}/{rec['n']})"
                                    if rec.get("overloaded")
                                    else ""
                                )
                                if rec["ok"]
                                else f"FAILED: {rec.get('error')}"
                            )
                        )
    if a.md if a.md is not None else not a.quick:
        from bench.summarize_more import latency_heading, latency_section

        heading = latency_heading(data)
        c.replace_md_section(c.BENCHMARKS_MD, heading, latency_section(data))
        c.log(f"rewrote '## {heading}' in {c.rel(c.BENCHMARKS_MD)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
