"""Turn raw benchmark JSON (bench/results/*.json) into BENCHMARKS.md sections.

    python -m bench.summarize [bench/results/{publish,consume}-....json]

Without an argument the newest non-quick publish and consume results are
used.  Only the "## Publish" and "## Consume" sections of BENCHMARKS.md are
rewritten (each from its own result file); other sections stay.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench import common as c
from bench import summarize_more

GO = "bench_writer"
TARGET_RSS_MB = 40.0


def _rates(runs: list[dict[str, Any]], client: str, wl: str) -> dict[int, float]:
    return {
        r["round"]: float(r["rate"])
        for r in runs
        if r["client"] == client and r["workload"] == wl and r.get("ok")
    }


def _cell(rates: dict[int, float]) -> str:
    if not rates:
        return "-"
    xs = list(rates.values())
    if len(xs) == 1:
        return c.fmt_rate(xs[0])
    return f"{c.fmt_rate(c.median(xs))} [{c.fmt_rate(min(xs))}-{c.fmt_rate(max(xs))}]"


def _cpu_cell(runs: list[dict[str, Any]], client: str, wl: str) -> str:
    ok = [r for r in runs if r["client"] == client and r["workload"] == wl and r.get("ok")]
    cl = [r["workload_cpu_s"] / r["n"] * 1e6 for r in ok if r.get("workload_cpu_s")]
    sv = [r["nsqd_cpu_s"] / r["n"] * 1e6 for r in ok if "nsqd_cpu_s" in r]
    if not cl:
        return "-"
    return f"{c.median(cl):.1f} / {c.median(sv):.1f}"


def _ratio(a: dict[int, float], b: dict[int, float]) -> float:
    """Median over rounds of a/b, using only rounds in which both ran."""
    return c.median([a[r] / b[r] for r in a if r in b and b[r] > 0])


def _fmt_ratio(x: float) -> str:
    return "n/a" if x != x else f"{x:.2f}x"


def _verdict(x: float, target: float) -> str:
    if x != x:
        return "**not measured**"
    return "**met**" if x >= target else "**NOT met**"


def _rss_row(what: str, kb: int) -> str:
    """The target-table row for one peak RSS (KiB) against the 40 MB limit."""
    mb = kb * 1024 / 1e6
    verdict = "**not measured**" if not mb else "**met**" if mb <= TARGET_RSS_MB else "**NOT met**"
    return f"| peak RSS of {what} | {mb:.1f} MB | <= {TARGET_RSS_MB:g} MB | {verdict} |"


def _peak_rss(runs: list[dict[str, Any]], clients: list[str]) -> dict[str, int]:
    """The largest peak RSS (KiB) over each client's runs (0 if none was measured)."""
    return {
        x: max(
            (r["max_rss_kb"] for r in runs if r["client"] == x and r.get("max_rss_kb")), default=0
        )
        for x in clients
    }


def _preamble(data: dict[str, Any]) -> list[str]:
    """Machine, server and Python versions, and the command that produced the results."""
    m = data["machine"]
    pythons = ", ".join(sorted(set(data.get("python_versions", {}).values())))
    return [
        f"Measured {data['started']}{' (quick smoke run)' if data.get('quick') else ''}: "
        f"{m['nproc']} CPUs ({m['cpu_model']}), {m['memory']} RAM, {m['os']}, "
        f"kernel {m['kernel']}; {data.get('nsqd_version', 'nsqd')}; Python {pythons}.",
        "",
        "Command (from the repository root):",
        "",
        "```",
        data["command"],
        "```",
        "",
    ]


BLOCKING = {"smartnsq-sync"}
BLOCKING_PEER = "nsq-py"  # the fastest blocking peer


def publish_section(data: dict[str, Any]) -> str:
    runs: list[dict[str, Any]] = data["runs"]
    clients = list(dict.fromkeys(r["client"] for r in runs))
    py_clients = [x for x in clients if x != GO]
    peers = [x for x in py_clients if not x.startswith("smartnsq")]
    smarts = [x for x in py_clients if x.startswith("smartnsq")]
    labels = {x.name: x.label for x in c.CLIENTS.values()}
    prm = data["params"]
    rss = _peak_rss(runs, clients)
    failures = [r for r in runs if not r.get("ok")]

    out = _preamble(data)
    out += [
        f"{data['rounds']} interleaved round(s); every cell is the **median [min-max]** in "
        "messages per second; peak RSS is the largest over all of that client's runs.",
        "",
        "| client | sequential PUB (1 in flight) | publish_many, batch 200 "
        "| concurrent publish, 64 tasks | peak RSS |",
        "|---|---|---|---|---|",
    ]
    for x in py_clients:
        name = f"**{labels.get(x, x)}**" if x in smarts else labels.get(x, x)
        out.append(
            f"| {name} | {_cell(_rates(runs, x, 'pub'))} | {_cell(_rates(runs, x, 'mpub'))} "
            f"| {_cell(_rates(runs, x, 'concurrent'))} | {c.fmt_mb(rss[x])} |"
        )
    if GO in clients:
        out.append(
            f"| Go `bench_writer`, GOMAXPROCS=1, 1 connection (ceiling) "
            f"| {_cell(_rates(runs, GO, 'pub'))} (`-batch-size 1`) "
            f"| {_cell(_rates(runs, GO, 'mpub'))} (`-batch-size 200`) | - "
            f"| {c.fmt_mb(rss[GO])} |"
        )

    # ratios and targets, for each smartnsq row (default asyncio loop, uvloop)
    go = {wl: _rates(runs, GO, wl) for wl in ("pub", "mpub")}

    def fastest(wl: str) -> str | None:
        cand = [
            (c.median(list(_rates(runs, p, wl).values())), p) for p in peers if _rates(runs, p, wl)
        ]
        return max(cand)[1] if cand else None

    rows: list[tuple[str, float, float, str]] = []
    for smart in smarts:
        s = {wl: _rates(runs, smart, wl) for wl in ("pub", "mpub", "concurrent")}
        who = f"{labels.get(smart, smart)}: "
        blocking = smart in BLOCKING
        # The blocking producer's targets: no event loop to pay for, so closer to Go's;
        # its peer is the fastest blocking client.
        for wl, title, go_target in (
            ("mpub", "publish_many (batch 200)", 1.0 if blocking else 0.9),
            ("pub", "sequential PUB", 0.8 if blocking else 0.5),
        ):
            rows.append(
                (
                    f"{who}{title} vs `bench_writer -batch-size {200 if wl == 'mpub' else 1}`",
                    _ratio(s[wl], go[wl]),
                    go_target,
                    "",
                )
            )
            fp = BLOCKING_PEER if blocking and _rates(runs, BLOCKING_PEER, wl) else fastest(wl)
            rows.append(
                (
                    f"{who}{title} vs fastest peer ({fp or 'none'})",
                    _ratio(s[wl], _rates(runs, fp, wl)) if fp else float("nan"),
                    1.0,
                    "",
                )
            )
        if blocking:
            continue
        rows.append(
            (
                f"{who}concurrent publish vs its sequential PUB",
                _ratio(s["concurrent"], s["pub"]),
                5.0,
                "",
            )
        )
    digests = list(dict.fromkeys(r["smartnsq_source"] for r in runs if "smartnsq_source" in r))
    src = f"smartnsq at git {data.get('git', '?')}, source digest {', '.join(digests) or '?'}."
    if len(digests) > 1:
        src += (
            f" **Warning: the smartnsq sources changed during this invocation "
            f"({len(digests)} versions); rerun for consistent figures.**"
        )
    out += ["", src]
    out += [
        "",
        "Ratios (median over rounds of the per-round ratio) and targets:",
        "",
        "| comparison | ratio | target | verdict |",
        "|---|---|---|---|",
    ]
    for title, x, target, _ in rows:
        out.append(f"| {title} | {_fmt_ratio(x)} | >= {target:g}x | {_verdict(x, target)} |")
    for smart in smarts:
        out.append(_rss_row(f"the {labels.get(smart, smart)} benchmark process", rss.get(smart, 0)))
    if "concurrent" in {r["workload"] for r in runs}:
        pc = _rates(runs, "pynsq", "concurrent")
        sc = _rates(runs, "smartnsq", "concurrent")
        if pc and sc:
            out.append("")
            out.append(
                f"For reference, smartnsq (asyncio) concurrent vs pynsq with 64 PUBs in flight: "
                f"{_fmt_ratio(_ratio(sc, pc))}."
            )

    out += [
        "",
        "CPU per message in microseconds, median over rounds: the client process "
        "during the timed workload / nsqd during the whole client run (start-up included). "
        "Median share of the 2 cores used by other jobs during a run: "
        f"{c.median([r['other_cpu_frac'] for r in runs if 'other_cpu_frac' in r]):.2f}.",
        "",
        "| client | sequential PUB | publish_many | concurrent |",
        "|---|---|---|---|",
    ]
    for x in py_clients:
        out.append(
            f"| {labels.get(x, x)} | "
            + " | ".join(_cpu_cell(runs, x, wl) for wl in ("pub", "mpub", "concurrent"))
            + " |"
        )
    if failures:
        out += ["", "Failed runs (not counted):", ""]
        for r in failures:
            err = str(r.get("error", "")).strip().splitlines()
            out.append(
                f"- round {r['round']} {r['workload']} {r['client']}: {err[-1] if err else '?'}"
            )

    out += [
        "",
        "Method:",
        "",
        "- One classic nsqd (`--mem-queue-size=10000000`, so every message stays in memory; "
        "no nsqlookupd) started through `compat.cluster`, binaries from "
        '`compat.servers.ensure_binaries("classic")`; everything on 127.0.0.1. Each run '
        "gets a fresh topic (created over HTTP before, deleted after the run).",
        "- Every client runs as its own subprocess: peers in their own virtualenvs under "
        "`bench/.venvs/` with the versions pinned in `bench/common.py`, smartnsq from the "
        "working tree with the benchmark's interpreter, once on asyncio's default event loop "
        "and once on uvloop's (`uvloop.run`; the `smartnsq[uvloop]` extra). The driver "
        "connects, sends one "
        "untimed warm-up PUB, then times the workload only with `time.monotonic()` and "
        "prints the count; the runner checks that nsqd's topic `message_count` equals "
        "warm-up + timed messages.",
        f"- Workloads, 100-byte bodies: sequential PUB, N = {prm['pub']['n']:,}, each "
        f"publish awaits nsqd's OK; publish_many/MPUB of 200, one batch in flight, "
        f"{prm['mpub']['seconds']:g} s or {prm['mpub']['n']:,} messages; 64 tasks calling "
        f"`publish()` on one Producer, {prm['concurrent']['seconds']:g} s or "
        f"{prm['concurrent']['n']:,} messages (pynsq: 64 PUBs kept in flight from its "
        "reply callbacks; other peers have no natural way to pipeline and are skipped).",
        f"- Ceilings: `GOMAXPROCS=1 bench_writer -size 100 -runfor {prm['go']['runfor']}` "
        "with `-batch-size 1` (sequential) and `-batch-size 200` (batched); it uses MPUB "
        "even for one message.",
        "- Round *r* runs every workload with the client list rotated by *r-1*; the runs "
        "are interleaved so background load hits all clients alike.",
        '- Peak RSS is GNU `time -v`\'s "Maximum resident set size" of each client '
        "process (the client is forked from `time`, not from the runner, whose RSS would "
        "otherwise carry over through exec); MB = 10^6 bytes.",
        "- Sequential PUB is bound by round-trip latency, not CPU: on this VM a round trip "
        "gets faster when the other core is busy (fewer idle wake-ups), so single runs swing "
        "by up to 2x with background load; per-round ratios against `bench_writer` from the "
        "same round are the figures to compare. The share of the cores used by other jobs "
        "is recorded per run from `/proc/stat` minus client, nsqd and runner CPU.",
        "- Raw per-run JSON (exact commands, rates, CPU seconds, RSS, load) is written to "
        "`bench/results/` (not committed); `python -m bench.summarize [FILE]` regenerates "
        "this section from it.",
    ]
    return "\n".join(out) + "\n"


CONSUME_GO = "bench_reader"
ASYNCIO_PEERS = ("ansq", "asyncnsq")


def _consume_rates(runs: list[dict[str, Any]], client: str) -> dict[int, float]:
    return _rates(runs, client, "consume")


def _per_msg_us(runs: list[dict[str, Any]], client: str, key: str) -> str:
    ok = [r for r in runs if r["client"] == client and r.get("ok") and r.get(key) is not None]
    xs = [r[key] / r["n"] * 1e6 for r in ok if r.get("n")]
    return f"{c.median(xs):.1f}" if xs else "-"


def consume_section(data: dict[str, Any]) -> str:
    runs: list[dict[str, Any]] = data["runs"]
    clients = list(dict.fromkeys(r["client"] for r in runs))
    labels: dict[str, str] = data.get("labels", {})
    prm = data["params"]
    n = prm["n"]
    rates = {x: _consume_rates(runs, x) for x in clients}
    rss = _peak_rss(runs, clients)
    go = rates.get(CONSUME_GO, {})
    failures = [r for r in runs if not r.get("ok")]

    out = _preamble(data)
    out += [
        f"{data['rounds']} interleaved round(s) of {n:,} pre-filled 100-byte messages, "
        f"max_in_flight {prm['mif']}, every message FINed; rate = messages / (consumer "
        "start to channel drained in nsqd's stats). Cells are the **median [min-max]** in "
        "messages per second; CPU columns are medians over rounds of CPU microseconds per "
        "message; peak RSS is the largest over all of that client's runs.",
        "",
        "| client | consume msg/s | vs `bench_reader` | client CPU µs/msg "
        "| nsqd CPU µs/msg | peak RSS |",
        "|---|---|---|---|---|---|",
    ]
    for x in clients:
        label = labels.get(x, x)
        name = f"**{label}**" if x.startswith("smartnsq") else label
        vs = "1.00x" if x == CONSUME_GO else _fmt_ratio(_ratio(rates[x], go)) if go else "-"
        out.append(
            f"| {name} | {_cell(rates[x])} | {vs} | {_per_msg_us(runs, x, 'workload_cpu_s')} "
            f"| {_per_msg_us(runs, x, 'nsqd_cpu_s')} | {c.fmt_mb(rss[x])} |"
        )

    def fastest(cands: list[str]) -> str | None:
        have = [(c.median(list(rates[p].values())), p) for p in cands if rates.get(p)]
        return max(have)[1] if have else None

    peers = [x for x in clients if x != CONSUME_GO and not x.startswith("smartnsq")]
    fp = fastest(peers)
    fa = fastest([x for x in peers if x in ASYNCIO_PEERS])
    s_async = rates.get("smartnsq", {})
    s_sync = rates.get("smartnsq-sync", {})

    def ratio_to(a: dict[int, float], b: str | None) -> float:
        return _ratio(a, rates[b]) if a and b and b in rates else float("nan")

    rows: list[tuple[str, float, float | None]] = [
        (f"async handler vs fastest Python peer ({fp or 'none'})", ratio_to(s_async, fp), 1.0),
        (f"async handler vs fastest asyncio peer ({fa or 'none'})", ratio_to(s_async, fa), 5.0),
    ]
    if fa != "asyncnsq" and "asyncnsq" in rates:
        rows.append(("async handler vs asyncnsq 1.2.1", ratio_to(s_async, "asyncnsq"), None))
    rows += [
        ("async handler vs `bench_reader` (GOMAXPROCS=1)", ratio_to(s_async, CONSUME_GO), None),
        (f"sync handler vs fastest Python peer ({fp or 'none'})", ratio_to(s_sync, fp), None),
        ("sync handler vs async handler", _ratio(s_sync, s_async), None),
    ]
    s_uv = rates.get("smartnsq-uvloop", {})
    if s_uv:
        rows += [
            (
                f"uvloop, async handler vs fastest Python peer ({fp or 'none'})",
                ratio_to(s_uv, fp),
                1.0,
            ),
            (
                f"uvloop, async handler vs fastest asyncio peer ({fa or 'none'})",
                ratio_to(s_uv, fa),
                5.0,
            ),
            ("uvloop vs asyncio, both async handler", _ratio(s_uv, s_async), None),
        ]
    digests = list(dict.fromkeys(r["smartnsq_source"] for r in runs if "smartnsq_source" in r))
    src = f"smartnsq at git {data.get('git', '?')}, source digest {', '.join(digests) or '?'}."
    if len(digests) > 1:
        src += (
            f" **Warning: the smartnsq sources changed during this invocation "
            f"({len(digests)} versions); rerun for consistent figures.**"
        )
    out += [
        "",
        src,
        "",
        "Ratios (median over rounds of the per-round ratio) and targets:",
        "",
        "| comparison | ratio | target | verdict |",
        "|---|---|---|---|",
    ]
    for title, x, target in rows:
        if target is None:
            out.append(f"| {title} | {_fmt_ratio(x)} | - | (reference) |")
        else:
            out.append(f"| {title} | {_fmt_ratio(x)} | >= {target:g}x | {_verdict(x, target)} |")
    smart = [x for x in clients if x.startswith("smartnsq") and rss.get(x)]
    out.append(
        _rss_row(
            "the smartnsq consumer process (every smartnsq row)",
            max((rss[x] for x in smart), default=0),
        )
    )
    out += [
        "",
        "Median share of the 2 cores used by other jobs during a run: "
        f"{c.median([r['other_cpu_frac'] for r in runs if 'other_cpu_frac' in r]):.2f}.",
    ]
    if failures:
        out += ["", "Failed runs (not counted):", ""]
        for r in failures:
            err = str(r.get("error", "")).strip().splitlines()
            out.append(f"- round {r['round']} {r['client']}: {err[-1] if err else '?'}")

    out += [
        "",
        "Method:",
        "",
        '- Same nsqd, venvs and process measurement as "Publish" (one classic nsqd with '
        "`--mem-queue-size=10000000`, started through `compat.cluster`; each client its own "
        "subprocess under GNU `time -v`, peers in `bench/.venvs/`).",
        f"- Before every run (untimed): a fresh topic, its channel `{'bench'}` created first, "
        f"then {n:,} bodies of 100 bytes through HTTP `/mpub?binary=true` in requests of "
        f"{prm['chunk']:,}; the runner waits for channel depth {n:,}.",
        "- The driver notes `t_start` just before it creates its consumer (connect, IDENTIFY "
        "and SUB are inside the timing) and consumes through the library's normal API: "
        "smartnsq `Consumer(topic, channel, handler, max_in_flight=2500)` with an "
        "`async def` handler (the main row; also on uvloop's event loop) or a plain `def` "
        "handler, returning normally to "
        "FIN; pynsq `Reader(message_handler=...)` returning True; gnsq `on_message` handler; "
        "nsq-py `for message in Reader(...): message.fin()`; asyncnsq 1.x and ansq "
        "`async for message in reader.messages(): await message.fin()` (ansq's Reader only "
        "sends RDY 1, so the public per-connection `conn.rdy(2500)` is sent after "
        "`create_reader`). When the handler has counted the last message the driver prints "
        "it; the runner then polls nsqd `/stats` every 2 ms until the channel has depth 0 "
        "and nothing in flight or deferred, and takes that moment as the end. "
        "CLOCK_MONOTONIC is system-wide, so runner and driver clocks compare.",
        "- Ceiling: `GOMAXPROCS=1 bench_reader -size 100 -rdy 2500` (one connection), "
        "timed from its spawn, stats polled every 5 ms during the run. It never flushes "
        'its last partial 4 KiB buffer of FINs, so for it "done" is depth 0 with at most '
        f"{195} messages in flight; the runner then ends it with SIGTERM.",
        "- Checked through nsqd's stats once drained, with the client still connected: "
        f"channel and topic `message_count` = {n:,}, depth 0, `requeue_count` and "
        "`timeout_count` 0, and the clients' summed `finish_count` = "
        f"{n:,} (bench_reader: `finish_count` + its unflushed in-flight = {n:,}). A run "
        "failing any check is listed above and not counted.",
        "- Client CPU per message: the driver's process CPU from `t_start` to the last "
        "handled message (bench_reader: the whole process); nsqd CPU: nsqd during the whole "
        "client run, start-up and the drain included. Clients that write each FIN with its "
        "own `send()` also cost nsqd one read per FIN.",
        "- Resolution: nsqd flushes a client's output buffer when it fills or every "
        "`output_buffer_timeout` (250 ms by default, which pynsq and gnsq also send "
        "explicitly). Once the backlog runs out, the last partial buffer of messages waits "
        "for that tick, so every Python client's end time falls on its connection's 250 ms "
        "grid: runs of about 1.3 s come out as 1.26, 1.51, 1.76 or 2.01 s, and the fast "
        "clients' rates move in steps of 15-20 %. bench_reader is exempt, as nsqd counts "
        "the unflushed messages as in flight and it may end with up to 195 in flight. The "
        "client CPU per message is not quantized and is the steadier comparison between "
        "the fast clients.",
        "- Round *r* runs the client list rotated by *r-1*. Peak RSS as for Publish (GNU "
        "`time -v`, MB = 10^6 bytes). Raw per-run JSON in `bench/results/consume-*.json`; "
        "`python -m bench.summarize FILE` regenerates this section from it.",
    ]
    return "\n".join(out) + "\n"


def latest(prefix: str, feed: str | None = None) -> Path | None:
    """The newest full run of a benchmark (not quick, nor a check run with ``--no-md``); for
    the latency one, of a ``feed``."""
    for p in sorted(c.RESULTS.glob(f"{prefix}-*.json"), reverse=True):
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if data.get("quick") or "--no-md" in data.get("command", ""):
            continue
        if data.get("params", {}).get("feed", "timer") == (feed or "timer"):
            return p
    return None


SECTIONS = {
    "publish": ("Publish", publish_section),
    "consume": ("Consume", consume_section),
    "latency": ("Latency", summarize_more.latency_section),
    "scale": ("Scale", summarize_more.scale_section),
    "tls_compress": ("TLS and compression", summarize_more.tls_section),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="?", type=Path)
    a = ap.parse_args(argv)
    if a.results:
        paths = [a.results]
    else:
        found = [latest(k) for k in SECTIONS] + [latest("latency", "pipe")]
        paths = [p for p in found if p]
    if not paths:
        print("no results in bench/results/", file=sys.stderr)
        return 1
    for path in paths:
        data = json.loads(path.read_text())
        heading, fn = SECTIONS[data.get("benchmark", "publish")]
        if fn is summarize_more.latency_section:
            heading = summarize_more.latency_heading(data)
        section = fn(data)
        c.replace_md_section(c.BENCHMARKS_MD, heading, section)
        print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
