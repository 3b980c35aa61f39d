"""``python -m tests.faults.campaign`` (``./dev campaign``): run seeds, one line each, and a
last line ``campaign: N seeds, K violations``; exit status 1 when K > 0."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from tests.faults.campaign.run import Result, run_seed
from tests.faults.campaign.schedule import generate


def line(result: Result, replay: str) -> str:
    s = result.schedule
    faults = ",".join(s.fault_kinds()) or "none"
    doors = ",".join(f"{f.source}>{f.sink}" for f in s.flows)
    head = (
        f"seed {s.seed} {s.digest()} flows={doors} faults={faults} "
        f"acked={result.messages} dup={result.duplicates} "
        f"excused={sum(f.excused for f in result.flows)} {result.seconds:.0f}s"
    )
    if not result.violations:
        return f"{head} ok"
    return (
        f"{head} VIOLATION {len(result.violations)}: "
        + " | ".join(result.violations)
        + f" (logs: {result.logs}; replay: {replay})"
    )


def _fork_present() -> bool:
    from compat.servers import BuildError, ensure_binaries

    try:
        ensure_binaries("youzan")
    except BuildError:
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev campaign", description=__doc__)
    parser.add_argument("--seed", type=int, help="replay exactly this seed's schedule")
    parser.add_argument("--seeds", type=int, default=3, help="how many seeds (default 3)")
    parser.add_argument("--first", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--kind", choices=("classic", "youzan"), default="classic")
    parser.add_argument(
        "--minutes", type=float, default=1.0, help="each seed's duration (default 1.0)"
    )
    parser.add_argument("--dir", type=Path, help="where the logs go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the logs of passing seeds")
    parser.add_argument(
        "--print-schedule", action="store_true", help="print the schedules, run nothing"
    )
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error("--minutes must be > 0")
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    if args.kind == "youzan" and not args.print_schedule and not _fork_present():
        print("campaign: the Youzan fork's servers are absent (./dev setup)", file=sys.stderr)
        return 2
    root = args.dir or Path(tempfile.mkdtemp(prefix="smartnsq-campaign-"))
    violations = 0
    faults: Counter[str] = Counter()
    messages = duplicates = 0
    for seed in seeds:
        schedule = generate(seed, args.kind, args.minutes)
        if args.print_schedule:
            print(f"seed {seed} {schedule.digest()} {schedule}")
            continue
        replay = f"./dev campaign --seed {seed} --kind {args.kind} --minutes {args.minutes:g}"
        result = run_seed(schedule, root, keep=args.keep)
        print(line(result, replay), flush=True)
        violations += bool(result.violations)
        faults.update(schedule.fault_kinds())
        messages += result.messages
        duplicates += result.duplicates
    if args.print_schedule:
        return 0
    print(
        f"faults drawn: {dict(sorted(faults.items()))}; messages acknowledged: {messages}; "
        f"duplicates: {duplicates}"
    )
    print(f"campaign: {len(seeds)} seeds, {violations} violations")
    return 1 if violations else 0


if __name__ == "__main__":
    # SIGTERM stops the campaign like Ctrl-C: the seed's servers and processes are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    raise SystemExit(main())
