"""Markdown sections of BENCHMARKS.md for the latency, scale and TLS/compression
benchmarks, from their results JSON (``python -m bench.summarize FILE`` dispatches here)."""

from __future__ import annotations

import statistics
from typing import Any

NOISE = (
    "**Noisy machine:** these runs shared the 2 cores with other developers' test suites; "
    "the median share of the machine used by other jobs during a run was {other:.0%} "
    "(from `/proc/stat`, minus client, nsqd and runner). Absolute figures move a lot from "
    "run to run; the same-round comparisons (ratios) are the ones to read."
)

QUIET = (
    "**Quiet machine:** the median share of the machine used by other jobs during a run was "
    "{other:.0%} (from `/proc/stat`, minus client, nsqd and runner)."
)


def _med(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def _preamble(data: dict[str, Any]) -> list[str]:
    m = data["machine"]
    others = [r["other_cpu_frac"] for r in data["runs"] if "other_cpu_frac" in r]
    out = [
        f"Measured {data['started']}{' (quick smoke run)' if data.get('quick') else ''}: "
        f"{m['nproc']} CPUs ({m['cpu_model']}), {m['memory']} RAM, {m['os']}, "
        f"kernel {m['kernel']}; {data.get('nsqd_version', 'nsqd')}; smartnsq at git "
        f"{data.get('git', '?')}, source digest {data['params'].get('source_digest', '?')}.",
        "",
        "Command (from the repository root):",
        "",
        "```",
        data["command"],
        "```",
        "",
    ]
    if others:
        other = _med(others)
        out += [(NOISE if other >= 0.05 else QUIET).format(other=other), ""]
    return out


def _ms(x: float) -> str:
    if x != x:
        return "-"
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:,.0f}"


def _verdict(ok: bool) -> str:
    return "**met**" if ok else "**NOT met**"


def _at_most(x: float, goal: float) -> str:
    """Met at or under the goal; "level" within 5 % over it (inside this machine's noise)."""
    if x <= goal:
        return "**met**"
    return "level (within 5 %)" if x <= goal * 1.05 else "**NOT met**"


# ---------------------------------------------------------------- latency
def latency_heading(data: dict[str, Any]) -> str:
    """The BENCHMARKS.md section of a latency run: its own for the shared clock."""
    return "Latency, one clock for every publisher" if _fed(data) else "Latency"


def _fed(data: dict[str, Any]) -> bool:
    return bool(data["params"].get("feed") == "pipe")


PACED = (
    "- Open loop: message *i* is due at t0 + i/rate; the publisher wakes up, publishes "
    "every message due by then in one call (PUB for one, MPUB for more) and sleeps until "
    "the next is due, so a slow consumer never slows it down. One call is in flight at a "
    "time; the stamp is taken right before the call. Each publisher sleeps with its own "
    "runtime's timers; the next section runs the same benchmark with one clock for all."
)

FED = (
    "- Open loop, one clock: `bench.metronome` (started with the publisher, timer slack "
    "1 ns) writes a byte to the publisher's stdin as each message falls due, "
    "{arrivals}; the schedule is the same for every client at a rate. The publisher "
    "reads its stdin the way its runtime reads any pipe (asyncio and uvloop: "
    "`connect_read_pipe`; blocking and Go: `read()`; tornado: `add_handler`) and "
    "publishes what it read in one call (PUB for one, MPUB for more; at most 10,000 "
    "messages a call); bytes that come while a call is in flight go in the next. The "
    "stamp is taken right before the call. "
    "So no publisher's sleep decides when it publishes: every runtime's timers round "
    "sub-millisecond sleeps differently (asyncio and Go's netpoller up to 1 ms; uvloop "
    "down to 0, so its pacer spins). The metronome's CPU counts as neither client nor "
    "other jobs."
)

ARRIVALS = {
    "poisson": "with exponential gaps (Poisson arrivals, a fixed seed per rate)",
    "constant": "every 1/rate seconds",
}


def latency_section(data: dict[str, Any]) -> str:
    p = data["params"]
    labels: dict[str, str] = p["labels"]
    runs = [r for r in data["runs"]]
    out = _preamble(data)
    if _fed(data):
        late = [r["metronome"]["late_p99_ms"] for r in runs if r.get("metronome")]
        out += [
            "The same benchmark, but every publisher is woken by one shared clock instead "
            "of pacing itself (see Method). The clock's own writes were "
            f"{_ms(_med(late))} ms behind its schedule at p99 (median over runs).",
            "",
        ]
    out.append(
        f"{data['rounds']} interleaved round(s); offered rates {', '.join(map(str, p['rates']))} "
        f"msg/s, {p['seconds']:g} s timed after {p['warmup']:g} s of warm-up per run; 100-byte "
        f"bodies; max_in_flight {p['mif']}. Latency = CLOCK_MONOTONIC at handler entry minus "
        "the stamp taken right before the publish call; cells are the **median over rounds** "
        "of each run's percentile, in milliseconds; *p99 per round* lists every round. CPU "
        "columns: µs of CPU per message of the publisher process, the consumer process and "
        "nsqd (medians over rounds)."
    )
    out.append("")
    keys = ("p50", "p90", "p99", "p99.9", "max")
    for setting, obt in p["settings"].items():
        what = (
            "nsqd's default output buffer (250 ms / 16 KiB)"
            if not obt
            else f"low latency: output_buffer_timeout {obt} ms"
        )
        out += [f"**{setting}**: {what}", ""]
        out.append(
            "| rate | client | p50 | p90 | p99 | p99.9 | max | p99 per round "
            "| CPU µs/msg pub / sub / nsqd |"
        )
        out.append("|---|---|---|---|---|---|---|---|---|")
        for rate in p["rates"]:
            for cl in p["clients"]:
                rs = [
                    r
                    for r in runs
                    if r["client"] == cl and r["rate"] == rate and r["setting"] == setting
                ]
                ok = [r for r in rs if r.get("ok")]
                name = labels[cl]
                name = f"**{name}**" if cl.startswith("smartnsq") else name
                if not ok:
                    err = (
                        (rs[0].get("error") or "no timed message in time")[:80] if rs else "not run"
                    )
                    out.append(f"| {rate:,} | {name} | failed: {err} | | | | | | |")
                    continue
                cells = [_ms(_med([r[k] for r in ok])) for k in keys]
                over = [r for r in ok if r.get("overloaded")]
                if over:
                    share = _med([r["received"] / max(1, r["n"]) for r in over])
                    name += (
                        f" (overloaded in {len(over)} of {len(ok)} rounds: "
                        f"{share:.0%} delivered in time; lower bounds)"
                    )
                per = " / ".join(
                    _ms(r["p99"]) if r.get("ok") else "x"
                    for r in sorted(rs, key=lambda r: r["round"])
                )
                cpu = " / ".join(
                    f"{_med([r[k] for r in ok]):.1f}"
                    for k in ("pub_cpu_us", "sub_cpu_us", "nsqd_cpu_us")
                )
                out.append(f"| {rate:,} | {name} | {' | '.join(cells)} | {per} | {cpu} |")
        out.append("")
    # verdicts
    out += [
        "Goals (per-round ratio of p99s, median over rounds; <= 1.00x means as fast or faster):",
        "",
    ]
    out.append("| goal | figure | verdict |")
    out.append("|---|---|---|")

    def p99s(cl: str, rate: int, setting: str) -> dict[int, float]:
        return {
            r["round"]: r["p99"]
            for r in runs
            if r["client"] == cl and r["rate"] == rate and r["setting"] == setting and r.get("ok")
        }

    gos = [g for g in ("go-nsq", "go-nsq-2") if g in p["clients"]]
    for cl in [x for x in p["clients"] if x.startswith("smartnsq")]:
        for setting in p["settings"]:
            for rate in p["rates"]:
                mine = p99s(cl, rate, setting)
                for go in gos:
                    theirs = p99s(go, rate, setting)
                    both = [mine[k] / theirs[k] for k in mine if k in theirs and theirs[k] > 0]
                    if not both:
                        out.append(
                            f"| {labels[cl]} p99 <= {labels[go]} p99, {rate:,} msg/s, {setting} "
                            "| no pair of runs | **NOT met** |"
                        )
                        continue
                    x = _med(both)
                    out.append(
                        f"| {labels[cl]} p99 <= {labels[go]} p99, {rate:,} msg/s, {setting} "
                        f"| {x:.2f}x | {_at_most(x, 1.0)} |"
                    )
    if "low" in p["settings"] and 10000 in p["rates"]:
        for cl in [x for x in p["clients"] if x.startswith("smartnsq")]:
            v = _med(list(p99s(cl, 10000, "low").values()))
            out.append(
                f"| {labels[cl]} p99 <= 5 ms at 10,000 msg/s, low latency | {_ms(v)} ms "
                f"| {_verdict(v <= 5.0)} |"
            )
    out.append("")
    out += [
        "Method:",
        "",
        "- One classic nsqd (`--mem-queue-size=10000000 --min-output-buffer-timeout=1ms`: "
        "nsqd refuses an output_buffer_timeout below 25 ms unless started so); "
        "everything on 127.0.0.1. Each run gets a fresh topic and channel.",
        "- Every client runs a consumer process and a publisher process of its own library "
        "(smartnsq from the working tree; pynsq in its own venv under `bench/.venvs/`; go-nsq "
        "as the benchmarks' own Go program `bench/go/main.go`, built against go-nsq v1.1.0 "
        "from the Go module proxy into the compat server cache). The consumer is started "
        "first and the publisher once nsqd shows it subscribed.",
        FED.format(arrivals=ARRIVALS[p.get("arrivals", "constant")]) if _fed(data) else PACED,
        "- Mixed rows (\"mixed: ...\") pair one library's consumer with the other's "
        "publisher, to show which side of a pair sets its latency; they have no goal.",
        "- Handler entry: smartnsq (asyncio, uvloop) an `async def` handler; smartnsq.sync "
        "the moment `for message in consumer` hands the message over; go-nsq a "
        "`HandlerFunc`; pynsq its `message_handler`. Every message is FINed by the library's "
        "normal path. go-nsq reads CLOCK_MONOTONIC as one `clock_gettime` at start plus Go's "
        "monotonic clock since, the same clock as Python's `time.monotonic_ns()`.",
        "- Low latency: smartnsq `Consumer(output_buffer_timeout=0.001)` (sent in IDENTIFY "
        "as 1 ms), go-nsq `Config.OutputBufferTimeout = time.Millisecond`, pynsq "
        "`Reader(output_buffer_timeout=1)`. Default: none of them sets it (go-nsq sends "
        "its own default, 250 ms, which is nsqd's).",
        "- Overloaded: a consumer that has not received every timed message within "
        "max(10 s, the run's length) after the publisher finished is stopped; its "
        "percentiles cover what it received and are lower bounds (latency of a consumer "
        "slower than the offered rate grows without limit).",
        "- CPU: publisher and consumer CPU from the processes themselves over the timed "
        "part; nsqd's from `/proc` over the whole publisher run, divided by all messages.",
        "- Raw per-run JSON (commands, percentiles, CPU, publisher lag) in "
        "`bench/results/latency-*.json`; `python -m bench.summarize FILE` rewrites this "
        "section from it.",
    ]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- scale
def scale_section(data: dict[str, Any]) -> str:
    p = data["params"]
    labels: dict[str, str] = p["labels"]
    runs = data["runs"]
    out = _preamble(data)
    out.append(
        f"{data['rounds']} interleaved round(s). One process with one Consumer per topic "
        "(max_in_flight 200, nsqlookupd discovery, two nsqd: two connections each) and one "
        f"Producer publishing {p['rate']:g} msg/s to every topic. Idle window {p['idle']:g} s "
        f"(no traffic), load window {p['load']:g} s, each after {p['settle']:g} s to settle. "
        "Cells: median [min-max] over rounds."
    )
    out += [""]
    out.append(
        "| topics | client | start-up s | idle CPU % of a core | under load: CPU % / handled "
        "msg/s (offered) | CPU µs/msg (publish + consume) | RSS MB | fds (connections) |"
    )
    out.append("|---|---|---|---|---|---|---|---|")

    def cell(xs: list[float], fmt: str) -> str:
        if not xs:
            return "-"
        return f"{format(_med(xs), fmt)} [{format(min(xs), fmt)}-{format(max(xs), fmt)}]"

    for topics in p["topics"]:
        for cl in p["clients"]:
            ok = [r for r in runs if r["client"] == cl and r["topics"] == topics and r.get("ok")]
            name = labels[cl]
            name = f"**{name}**" if cl.startswith("smartnsq") else name
            if not ok:
                errs = [
                    r.get("error", "") for r in runs if r["client"] == cl and r["topics"] == topics
                ]
                out.append(
                    f"| {topics:,} | {name} | failed: {(errs or ['not run'])[0][:80]} | | | | | |"
                )
                continue
            load = (
                f"{_med([r['load_cpu_share'] * 100 for r in ok]):.0f} % / "
                f"{_med([r['handled_rate'] for r in ok]):,.0f} ({ok[0]['offered_rate']:,.0f})"
            )
            fds = f"{max(r['load_fds'] for r in ok)} ({ok[0]['nsqd_connections']})"
            rss = [max(r["idle_rss_kb"], r["load_rss_kb"]) * 1.024 / 1000 for r in ok]
            out.append(
                f"| {topics:,} | {name} | {cell([r['startup_s'] for r in ok], '.2f')} "
                f"| {cell([r['idle_cpu_share'] * 100 for r in ok], '.2f')} | {load} "
                f"| {cell([r['cpu_us_per_msg'] for r in ok], '.1f')} "
                f"| {cell(rss, '.0f')} "
                f"| {fds} |"
            )
    out += ["", "Goals (smartnsq rows; medians over rounds):", ""]
    out += ["| goal | client | figure | verdict |", "|---|---|---|---|"]
    for cl in [x for x in p["clients"] if x.startswith("smartnsq")]:
        for topics in p["topics"]:
            ok = [r for r in runs if r["client"] == cl and r["topics"] == topics and r.get("ok")]
            if not ok:
                continue
            if topics == 100:
                s = _med([r["startup_s"] for r in ok])
                out.append(
                    f"| start-up <= 3 s, 100 consumers | {labels[cl]} | {s:.2f} s "
                    f"| {_verdict(s <= 3)} |"
                )
            i = _med([r["idle_cpu_share"] * 100 for r in ok])
            out.append(
                f"| idle CPU < 1 % of a core, {topics:,} topics | {labels[cl]} | {i:.2f} % "
                f"| {_verdict(i < 1)} |"
            )
            m = _med([max(r["idle_rss_kb"], r["load_rss_kb"]) * 1.024 / 1000 for r in ok])
            out.append(
                f"| RSS < 100 MB, {topics:,} topics | {labels[cl]} | {m:.0f} MB "
                f"| {_verdict(m < 100)} |"
            )
            extra = max(r["load_fds"] - r["nsqd_connections"] for r in ok)
            out.append(
                f"| descriptors = connections + a constant, {topics:,} topics | {labels[cl]} "
                f"| connections + {extra} | {_verdict(extra <= 16)} |"
            )
    out += [
        "",
        "Method:",
        "",
        "- A classic cluster from `compat.cluster`: one nsqlookupd, two nsqd; every topic "
        "is created on both nsqd before the run, so lookupd lists two producers per topic.",
        "- smartnsq: `bench/drivers/scale_smartnsq.py` enters one `Consumer(topic, 'c', "
        "handler, lookupd_http_addresses=[...], max_in_flight=200)` per topic, then one "
        "`Producer(nsqd_tcp_addresses=[both])` (round-robin); every 0.1 s it calls "
        "`publish_many` with rate/10 bodies for every topic, all topics concurrently. The "
        "*concurrency=1* row passes `concurrency=1` (at most one handler task per consumer; "
        "the default allows min(max_in_flight, 100), started only as messages wait). It "
        "polls only the consumers not yet subscribed, backing off with the poll's own cost. "
        "go-nsq: the same shape in `bench/go` "
        "(`scale`), one `Producer` per nsqd used round-robin (a go-nsq Producer is one "
        "connection), `MultiPublishAsync`, GOMAXPROCS=1.",
        "- Start-up: from just before the first Consumer is created to every consumer "
        "reporting a connection to each nsqd (the driver's own clock). CPU share and CPU per "
        "message from `/proc/PID/stat` over the windows; per message = CPU / messages "
        "handled in the window (each one was also published by the same process). RSS = "
        "`VmRSS` (MB = 10^6 bytes), descriptors = entries of `/proc/PID/fd`, both at the end "
        "of the load window; connections = 2 per consumer + the producer's.",
        "- Raw JSON in `bench/results/scale-*.json`; `python -m bench.summarize FILE` "
        "rewrites this section from it.",
    ]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- TLS and compression
def tls_section(data: dict[str, Any]) -> str:
    p = data["params"]
    labels: dict[str, str] = p["labels"]
    runs = data["runs"]
    out = _preamble(data)
    out.append(
        f"{data['rounds']} interleaved round(s). publish: `publish_many` of 200 100-byte "
        f"bodies, one batch in flight, {p['seconds']:g} s; consume: {p['n']:,} pre-filled "
        "messages, max_in_flight 2500, every one FINed. Cells: msg/s, median [min-max] over "
        "rounds; ratios are the median of the per-round ratio to go-nsq with the same "
        "settings in the same round."
    )
    out.append("")

    def rates(cl: str, wl: str, mode: str) -> dict[int, float]:
        return {
            r["round"]: r["rate"]
            for r in runs
            if r["client"] == cl and r["workload"] == wl and r["mode"] == mode and r.get("ok")
        }

    def fmt(x: float) -> str:
        return f"{x / 1000:.0f}k" if x >= 1e4 else f"{x:,.0f}"

    gos = [g for g in ("go-nsq", "go-nsq-2") if g in p["clients"]]
    mine = [x for x in p["clients"] if x.startswith("smartnsq")]
    for wl in p["workloads"]:
        cls = [x for x in p["clients"] if wl == "publish" or x != "smartnsq-sync"]
        out += [f"**{wl}**", ""]
        out.append("| mode | " + " | ".join(labels[x] for x in cls) + " |")
        out.append("|---|" + "---|" * len(cls))
        for mode in p["modes"]:
            cells = []
            for cl in cls:
                rs = list(rates(cl, wl, mode).values())
                cells.append(f"{fmt(_med(rs))} [{fmt(min(rs))}-{fmt(max(rs))}]" if rs else "failed")
            out.append(f"| {mode} | " + " | ".join(cells) + " |")
        out.append("")
        out.append("CPU µs per message, client / nsqd (medians over rounds):")
        out.append("")
        out.append("| mode | " + " | ".join(labels[x] for x in cls) + " |")
        out.append("|---|" + "---|" * len(cls))
        for mode in p["modes"]:
            cells = []
            for cl in cls:
                ok = [
                    r
                    for r in runs
                    if r["client"] == cl
                    and r["workload"] == wl
                    and r["mode"] == mode
                    and r.get("ok")
                ]
                cells.append(
                    f"{_med([r['client_cpu_us'] for r in ok]):.2f} / "
                    f"{_med([r['nsqd_cpu_us'] for r in ok]):.2f}"
                    if ok
                    else "-"
                )
            out.append(f"| {mode} | " + " | ".join(cells) + " |")
        out.append("")
    out += ["Goal: >= 0.8x go-nsq's rate with the same settings in the same run.", ""]
    out += [
        "| workload | mode | client | vs "
        + " | vs ".join(labels[g] for g in gos)
        + " | verdict (vs GOMAXPROCS=1) |"
    ]
    out.append("|---|---|---|" + "---|" * len(gos) + "---|")
    for wl in p["workloads"]:
        for mode in p["modes"]:
            for cl in mine:
                if wl == "consume" and cl == "smartnsq-sync":
                    continue
                a = rates(cl, wl, mode)
                ratios = []
                for g in gos:
                    b = rates(g, wl, mode)
                    both = [a[k] / b[k] for k in a if k in b and b[k] > 0]
                    ratios.append(_med(both) if both else float("nan"))
                first = ratios[0] if ratios else float("nan")
                out.append(
                    f"| {wl} | {mode} | {labels[cl]} | "
                    + " | ".join(f"{x:.2f}x" for x in ratios)
                    + f" | {_verdict(first >= 0.8)} |"
                )
    out += [
        "",
        "Method:",
        "",
        "- One classic nsqd started with `--tls-cert`/`--tls-key` of a certificate made for "
        "the run (trustme); clients negotiate TLS in IDENTIFY (`tls_v1`). smartnsq checks the "
        "certificate against the run's CA; go-nsq skips verification (`InsecureSkipVerify`), "
        "which costs it nothing per message. Snappy and DEFLATE (level 6) are negotiated "
        "the same way; TLS+Snappy is Snappy inside TLS.",
        "- smartnsq: `bench/drivers/tc_smartnsq.py` (asyncio, uvloop, and the blocking "
        "`smartnsq.sync.Producer` for publish). go-nsq: `bench/go` (`tpub`/`tsub`), because "
        "nsqd's `bench_writer`/`bench_reader` have no TLS or compression; for plain "
        "connections the Publish and Consume sections above compare with those.",
        "- Rate and client CPU are measured by each client over its own timed part; nsqd's "
        "CPU from `/proc` over the whole client run. Raw JSON in "
        "`bench/results/tls_compress-*.json`; `python -m bench.summarize FILE` rewrites this "
        "section from it.",
    ]
    return "\n".join(out) + "\n"
