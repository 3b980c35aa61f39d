"""to-nsq against real nsqd: copy (replay) a topic, FIN only after the copy is acknowledged."""

from __future__ import annotations

import json
import time

import pytest

from tests.cli.clihelp import lines_of, one_line_error, run_cli
from tests.helpers import channel_stats, create_channel, unique

pytestmark = pytest.mark.integration

NOWHERE = "127.0.0.1:1"


def _bodies(nsqd_tcp: str, topic: str, n: int) -> list[str]:
    tail = run_cli("tail", "--nsqd", nsqd_tcp, "--channel", "c", "-n", str(n), topic)
    assert tail.returncode == 0, tail.stderr
    return tail.stdout.decode().splitlines()


def test_to_nsq_replays_a_topic_and_finishes_only_copied_messages(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    src, dst = unique("cli_dead"), unique("cli_orders")
    create_channel(nsqd.http, src, "replay")
    create_channel(nsqd.http, dst, "c")
    bodies = [f"order-{i}" for i in range(200)]
    assert run_cli("pub", "--nsqd", nsqd.tcp, src, input=lines_of(*bodies)).returncode == 0

    # The destination is down: nothing is finished, everything stays in the source, and
    # copies failing again and again end the command with status 1 and the reason.
    down = run_cli(
        "to-nsq", src, "--nsqd", nsqd.tcp, "--channel", "replay", "--to", dst,
        "--to-nsqd", NOWHERE, "--json", "--producer-opt", "timeout=1",
    )  # fmt: skip
    assert down.returncode == 1, down.stderr
    err = down.stderr.decode()
    assert err.endswith("\n") and "failed in a row" in err.splitlines()[-1], err
    summary = json.loads(down.stdout)
    assert summary["published"] == 0 and summary["failed_attempts"] > 0
    assert (summary["ok"], summary["status"], summary["exit_status"]) == (False, "failed", 1)
    kept = channel_stats(nsqd.http, src, "replay")
    assert kept is not None and kept["message_count"] == 200
    assert kept["depth"] + kept["deferred_count"] + kept["in_flight_count"] == 200

    # Up again (the requeued ones come back after their delay: skip it with a fresh channel).
    create_channel(nsqd.http, src, "replay2")
    assert run_cli("pub", "--nsqd", nsqd.tcp, src, input=lines_of(*bodies)).returncode == 0
    started = time.monotonic()
    ok = run_cli(
        "to-nsq", src, "--nsqd", nsqd.tcp, "--channel", "replay2", "--to", dst,
        "--limit", "200", "--rate", "400", "--json",
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert time.monotonic() - started >= 0.45  # 200 at 400/s
    assert json.loads(ok.stdout) == {
        "from": src, "to": dst, "published": 200, "failed_attempts": 0, "last_error": None,
        "ok": True, "status": "ok", "exit_status": 0, "error": None,
    }  # fmt: skip
    done = channel_stats(nsqd.http, src, "replay2")
    assert done is not None and (done["depth"], done["in_flight_count"]) == (0, 0)
    assert sorted(_bodies(nsqd.tcp, dst, 200)) == sorted(bodies)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["t", "--nsqd", NOWHERE], ["--to names the same topic"]),
        (["--nsqd", NOWHERE, "--to", "x"], ["name one topic"]),
        (["t", "--nsqd", NOWHERE, "--to", "x", "--producer-opt", "tls=1"], ["--tls"]),
    ],
)
def test_to_nsq_bad_input_is_one_line(args, needles):
    one_line_error(run_cli("to-nsq", *args), *needles)
