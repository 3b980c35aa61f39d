"""The campaign's runner on real servers: a calm seed passes, and a lost message is caught."""

from __future__ import annotations

import pytest

from tests.faults.campaign import doors
from tests.faults.campaign.run import run_seed
from tests.faults.campaign.schedule import Flow, Schedule

pytestmark = [pytest.mark.integration, pytest.mark.faults]

CALM = Schedule(
    seed=-1,
    kind="classic",
    seconds=8.0,
    nsqd=2,
    lookupd=1,
    flows=(
        Flow(0, "async-producer", "async-consumer", rate=50),
        Flow(1, "pub", "to-file", rate=50),
    ),
)


def test_a_calm_seed_has_no_violation(tmp_path):
    result = run_seed(CALM, tmp_path)
    assert result.violations == []
    assert [f.acked for f in result.flows] == [f.handled for f in result.flows]
    assert all(f.acked > 100 for f in result.flows), result.flows
    assert result.logs is None  # a passing seed's logs are removed


@pytest.mark.slow  # the runner waits its whole settling time for the missing message
def test_a_message_finished_but_never_handled_is_reported_lost(tmp_path, monkeypatch):
    handle = doors.Book.handle

    def forgetful(book: doors.Book, body: bytes) -> None:
        if body != b"f0:a1:3":  # handled (FIN), never booked: as if the handler lost it
            handle(book, body)

    monkeypatch.setattr(doors.Book, "handle", forgetful)
    result = run_seed(CALM, tmp_path)
    assert len(result.violations) == 1, result.violations
    assert result.violations[0].startswith("lost: flow0 (async-producer -> async-consumer): 1 of ")
    assert "f0:a1:3" in result.violations[0]
    assert result.logs is not None and (result.logs / "timeline.txt").exists()
