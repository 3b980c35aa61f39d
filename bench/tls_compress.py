"""TLS and compression at speed: smartnsq vs go-nsq v1.1.0 over TLS, Snappy, DEFLATE and
TLS+Snappy (and plain, for reference), in the same run.

One classic nsqd with a certificate made for the run (trustme; TLS is negotiated, not
required). Workloads: ``publish`` = ``publish_many`` batches of 200 100-byte bodies, one
batch in flight, for --seconds; ``consume`` = N messages pre-filled over HTTP, consumed with
max_in_flight 2500 and FINed, timed by the client from consumer creation to the N-th handler
call. The Go side is the benchmarks' own go-nsq program (``bench/go``: ``tpub``/``tsub``),
because nsqd's ``bench_writer``/``bench_reader`` speak neither TLS nor compression; it runs
with GOMAXPROCS=1 (``go-nsq``) and GOMAXPROCS=2 (``go-nsq-2``). Round r rotates the client
order by r-1 within every (workload, mode).

    python -m bench.tls_compress [--rounds 3] [--modes plain,tls,snappy,deflate,tls+snappy]
                                 [--seconds 5] [--n 200000] [--clients ...] [--quick]

Raw results: bench/results/tls_compress-<time>.json; a full run rewrites "## TLS and
compression" in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from bench import common as c
from bench.gobuild import ensure_nsqgo

MODES = ("plain", "tls", "snappy", "deflate", "tls+snappy")
LABELS = {
    "smartnsq": "smartnsq (asyncio)",
    "smartnsq-uvloop": "smartnsq (uvloop)",
    "smartnsq-sync": "smartnsq.sync (blocking)",
    "go-nsq": "go-nsq v1.1.0, GOMAXPROCS=1",
    "go-nsq-2": "go-nsq v1.1.0, GOMAXPROCS=2",
}
PUBLISH_ONLY = {"smartnsq-sync"}


def make_cert(workdir: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1: (ca.pem, cert.pem, key.pem)."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    paths = workdir / "ca.pem", workdir / "cert.pem", workdir / "key.pem"
    ca.cert_pem.write_to_path(str(paths[0]))
    cert.cert_chain_pems[0].write_to_path(str(paths[1]))
    cert.private_key_pem.write_to_path(str(paths[2]))
    return paths


def command(
    client: str, role: str, mode: str, args: dict[str, Any], nsqgo: Path, ca: Path
) -> tuple[list[str], dict[str, str]]:
    tls, snappy, deflate = "tls" in mode, "snappy" in mode, "deflate" in mode
    if client.startswith("go-nsq"):
        cmd = [str(nsqgo), role, "-addr", args["addr"], "-topic", args["topic"]]
        if role == "tpub":
            cmd += ["-seconds", str(args["seconds"]), "-batch", "200"]
        else:
            cmd += ["-channel", "tc", "-n", str(args["n"]), "-mif", "2500"]
        cmd += ["-tls"] * tls + ["-snappy"] * snappy + ["-deflate"] * deflate
        return cmd, dict(os.environ, GOMAXPROCS="2" if client == "go-nsq-2" else "1")
    cmd = [sys.executable, str(c.DRIVERS / "tc_smartnsq.py"), role, "--addr", args["addr"]]
    cmd += [
        "--topic",
        args["topic"],
        "--variant",
        client.partition("-")[2].replace("sync", "blocking"),
    ]
    if role == "tpub":
        cmd += ["--seconds", str(args["seconds"]), "--batch", "200"]
    else:
        cmd += ["--channel", "tc", "--n", str(args["n"]), "--mif", "2500"]
    cmd += ["--tls", str(ca)] * tls + ["--snappy"] * snappy + ["--deflate"] * deflate
    return cmd, dict(os.environ, PYTHONPATH=str(c.ROOT))


def run_one(
    nsqd: c.Nsqd,
    client: str,
    workload: str,
    mode: str,
    a: argparse.Namespace,
    nsqgo: Path,
    ca: Path,
) -> dict[str, Any]:
    topic = f"tc_{uuid.uuid4().hex[:10]}"
    rec: dict[str, Any] = {"client": client, "workload": workload, "mode": mode, "ok": False}
    nsqd.create_topic(topic)
    args = {"addr": nsqd.tcp, "topic": topic, "seconds": a.seconds, "n": a.n}
    role = "tpub" if workload == "publish" else "tsub"
    if role == "tsub":
        nsqd.create_channel(topic, "tc")
        left = a.n
        while left > 0:
            nsqd.mpub_binary(topic, b"x" * 100, min(10_000, left))
            left -= 10_000
    cmd, env = command(client, role, mode, args, nsqgo, ca)
    rec["cmd"] = shlex.join(cmd)
    snap0 = c.cpu_snapshot(nsqd.pid)
    pr = c.run_measured(cmd, env=env, timeout=a.seconds + 120)
    snap1 = c.cpu_snapshot(nsqd.pid)
    rec.update(c.measures(pr))
    rec.update(c.cpu_delta(snap0, snap1, pr.cpu_s))
    res = c.parse_result_line(pr.stdout)
    if res is None:
        rec["error"] = "timed out" if pr.timed_out else f"exit {pr.returncode}"
        rec["stderr_tail"] = pr.stderr[-1500:]
    else:
        rec.update(n=res["n"], rate=res["rate"], elapsed=res["elapsed"])
        rec["client_cpu_us"] = res["cpu"] / max(1, res["n"]) * 1e6
        rec["nsqd_cpu_us"] = rec.get("nsqd_cpu_s", 0.0) / max(1, res["n"]) * 1e6
        if role == "tpub":
            got = nsqd.message_count(topic)
            rec["ok"] = got >= res["n"]
            if not rec["ok"]:
                rec["error"] = f"nsqd counted {got} of {res['n']}"
        else:
            rec["ok"] = res["n"] == a.n
    nsqd.delete_topic(topic)
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.tls_compress", description=__doc__)
    c.runner_arguments(ap, 3, "1 round, 2 s publishing, 50,000 to consume")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--workloads", default="publish,consume")
    ap.add_argument("--seconds", type=float, default=None, help="publish seconds (5)")
    ap.add_argument("--n", type=int, default=None, help="messages to consume (200,000)")
    ap.add_argument("--clients", default=",".join(LABELS))
    a = c.parse_runner_arguments(ap, argv)
    a.seconds = a.seconds if a.seconds is not None else (2.0 if a.quick else 5.0)
    a.n = a.n if a.n is not None else (50_000 if a.quick else 200_000)
    modes = a.modes.split(",")
    clients = a.clients.split(",")
    workloads = a.workloads.split(",")
    nsqgo = ensure_nsqgo()
    params = {
        "modes": modes,
        "workloads": workloads,
        "seconds": a.seconds,
        "n": a.n,
        "clients": clients,
        "labels": {k: LABELS[k] for k in clients},
        "source_digest": c.source_digest(),
    }
    _, out, data = c.new_results(
        "tls_compress", list(argv if argv is not None else sys.argv[1:]), a.quick, a.rounds, params
    )
    data["runs"] = []
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as tmp:
        ca, cert, key = make_cert(Path(tmp))
        extra = [f"--tls-cert={cert}", f"--tls-key={key}"]
        with c.benchmark_nsqd(data, out, extra) as nsqd:
            for rnd in range(1, a.rounds + 1):
                for workload in workloads:
                    for mode in modes:
                        eligible = [
                            x for x in clients if workload == "publish" or x not in PUBLISH_ONLY
                        ]
                        k = (rnd - 1) % len(eligible)
                        for client in eligible[k:] + eligible[:k]:
                            rec = run_one(nsqd, client, workload, mode, a, nsqgo, ca)
                            rec["round"] = rnd
                            data["runs"].append(rec)
                            out.write_text(json.dumps(data, indent=1) + "\n")
                            c.log(
                                f"r{rnd} {workload:<8} {mode:<10} {client:<16} "
                                + (
                                    f"{c.fmt_rate(rec['rate']):>7} msg/s  cpu client/nsqd "
                                    f"{rec['client_cpu_us']:.2f}/{rec['nsqd_cpu_us']:.2f} us  "
                                    f"other {rec.get('other_cpu_frac', -1):.2f}"
                                    if rec["ok"]
                                    else f"FAILED: {rec.get('error')} {rec.get('stderr_tail', '')}"
                                )
                            )
    if a.md if a.md is not None else not a.quick:
        from bench.summarize_more import tls_section

        c.replace_md_section(c.BENCHMARKS_MD, "TLS and compression", tls_section(data))
        c.log(f"rewrote '## TLS and compression' in {c.rel(c.BENCHMARKS_MD)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
