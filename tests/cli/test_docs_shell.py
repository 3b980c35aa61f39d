"""The shell example of docs/cli.md runs as pasted against a real cluster."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.clihelp import cli_env
from tests.helpers import channel_stats, create_channel, unique

pytestmark = pytest.mark.integration

DOC = Path(__file__).parents[2] / "docs" / "cli.md"

# The commands that run until Ctrl-C get one after a few seconds (exit status 130 is theirs).
PRELUDE = f"""
set -euo pipefail
smartnsq() {{
    case " $* " in
        *" --show-meta "*|*" to-file "*)
            timeout --preserve-status -s INT 3 {sys.executable} -m smartnsq "$@" || [ $? = 130 ]
            ;;
        *) {sys.executable} -m smartnsq "$@" ;;
    esac
}}
"""


def test_the_shell_example_runs_as_pasted(classic_cluster, tmp_path):
    # Not a skip: ./dev setup installs jq, and the guide's example needs it.
    assert shutil.which("jq"), "jq is missing: run ./dev setup (it installs Debian's jq)"
    block, _replay = re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.S)
    topic = unique("doc_events")
    script = (
        block.replace("127.0.0.1:4161", classic_cluster.lookupd[0].http)
        .replace("127.0.0.1:4150", classic_cluster.nsqd[0].tcp)
        .replace("events", topic)
    )
    result = subprocess.run(
        ["bash", "-c", PRELUDE + script],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    out = result.stdout.decode()
    assert out.startswith('hello\nworld\n{"customer_id": 7, "item": "tea"}\n'), out
    assert f"│ {topic}" in out  # stat's tables


def test_the_dead_letter_replay_example_runs_as_pasted(classic_cluster, tmp_path):
    nsqd = classic_cluster.nsqd[0]
    (_, replay) = re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.S)
    dead, orders = unique("doc_dead"), unique("doc_orders")
    create_channel(nsqd.http, orders, "c")
    pub = subprocess.run(
        [sys.executable, "-m", "smartnsq", "pub", "--nsqd", nsqd.tcp, dead],
        input=b"a\nb\n", env=cli_env(), capture_output=True, check=False,
    )  # fmt: skip
    assert pub.returncode == 0, pub.stderr
    script = (
        replay.replace("127.0.0.1:4161", classic_cluster.lookupd[0].http)
        .replace("orders.dead", dead)
        .replace("orders", orders)
        # Stop once both are copied instead of waiting for Ctrl-C (a loaded machine may
        # take seconds just to start).
        .replace("--json", "--json --limit 2")
    )
    result = subprocess.run(
        ["bash", "-c", PRELUDE + script], cwd=tmp_path, env=cli_env(), capture_output=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout)["published"] == 2
    assert (channel_stats(nsqd.http, orders, "c") or {}).get("depth") == 2
