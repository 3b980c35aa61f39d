"""The campaign's command line: one line per seed, the last line, the exit status."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.campaign import __main__ as cli
from tests.faults.campaign.run import FlowResult, Result
from tests.faults.campaign.schedule import Schedule, generate


def fake_run(broken: set[int]):
    def run_seed(schedule: Schedule, root: Path, keep: bool = False) -> Result:
        result = Result(
            schedule, [FlowResult(f, acked=10, handled=11, duplicates=1) for f in schedule.flows]
        )
        if schedule.seed in broken:
            result.violations.append("lost: flow0 (pub -> to-file): 1 of 10 acknowledged")
            result.logs = root / f"seed-{schedule.seed}"
        return result

    return run_seed


def test_one_line_per_seed_and_the_last_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(cli, "run_seed", fake_run(broken=set()))
    status = cli.main(["--seeds", "3", "--first", "5", "--minutes", "0.25", "--dir", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert status == 0
    assert [x.split()[:3] for x in lines[:3]] == [
        ["seed", str(s), generate(s, "classic", 0.25).digest()] for s in (5, 6, 7)
    ]
    assert all(x.endswith(" ok") for x in lines[:3])
    assert lines[-1] == "campaign: 3 seeds, 0 violations"


def test_a_failing_seed_names_the_invariant_its_logs_and_its_replay(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(cli, "run_seed", fake_run(broken={2}))
    status = cli.main(["--seeds", "2", "--first", "1", "--minutes", "0.5", "--dir", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert status == 1
    bad = lines[1]
    assert bad.startswith("seed 2 ") and "VIOLATION 1: lost: flow0" in bad
    assert f"logs: {tmp_path / 'seed-2'}" in bad
    assert "replay: ./dev campaign --seed 2 --kind classic --minutes 0.5" in bad
    assert lines[-1] == "campaign: 2 seeds, 1 violations"


def test_seed_replays_exactly_one_schedule(monkeypatch, capsys, tmp_path):
    seen: list[Schedule] = []

    def run_seed(schedule: Schedule, root: Path, keep: bool = False) -> Result:
        seen.append(schedule)
        return Result(schedule)

    monkeypatch.setattr(cli, "run_seed", run_seed)
    assert cli.main(["--seed", "17", "--minutes", "0.5", "--dir", str(tmp_path)]) == 0
    assert seen == [generate(17, "classic", 0.5)]
    assert capsys.readouterr().out.splitlines()[-1] == "campaign: 1 seeds, 0 violations"


def test_minutes_must_be_positive(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--minutes", "0"])
    assert exc.value.code == 2
