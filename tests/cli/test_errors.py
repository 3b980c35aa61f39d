"""Bad input gives one line naming what to fix and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cli.clihelp import cli_env, one_line_error, run_cli
from tests.helpers import unique

NOWHERE = "127.0.0.1:1"  # nothing listens on port 1


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["pub"], ["Missing argument 'TOPIC'"]),
        (["pub", "t"], ["--lookupd", "--nsqd"]),
        (["pub", "--nsqd", NOWHERE, "bad topic!"], ["topic name"]),
        (["pub", "--nsqd", NOWHERE, "t", "/no/such/file"], ["/no/such/file"]),
        (["pub", "--nsqd", NOWHERE, "--key", "a", "--key-field", "b", "t"], ["--key"]),
        (["pub", "--nsqd", NOWHERE, "--rate", "-1", "t"], ["--rate"]),
        (["pub", "--nsqd", "host:99999", "t"], ["host:99999"]),
        (["pub", "--lookupd", "ftp://x", "t"], ["ftp://x"]),
        (["tail", "--nsqd", NOWHERE, "t"], ["cannot reach", NOWHERE]),
        (["tail", "--nsqd", NOWHERE, "-n", "0", "t"], ["--count"]),
        (["to-file", "--nsqd", NOWHERE, "t"], ["--dir"]),
        (["to-file", "--nsqd", NOWHERE, "--dir", ".", "--rotate-size", "lots", "t"], ["lots"]),
        (["to-file", "--nsqd", NOWHERE, "--dir", ".", "--pattern", "a/b", "t"], ["--pattern"]),
        (["stat", "--nsqd", NOWHERE], ["--nsqd-http"]),
        (["stat", "--nsqd-http", NOWHERE], ["no nsqd answered"]),
        (["stat", "--lookupd", NOWHERE], ["lookupd"]),
        (["pub", "--nsqd", NOWHERE, "--tls-ca", "/no/ca.pem", "t"], ["/no/ca.pem"]),
        (["bogus"], ["No such command 'bogus'"]),
    ],
)
def test_bad_input_is_one_line_and_a_non_zero_exit(args, needles):
    result = run_cli(*args)
    line = one_line_error(result, *needles)
    assert line.startswith("smartnsq")


def test_environment_variables_are_read_and_split_on_commas():
    # Two unreachable nsqd from NSQ_NSQD: both are named, so both were read.
    result = run_cli("tail", "t", env=cli_env(NSQ_NSQD=f"{NOWHERE}, 127.0.0.1:2"))
    one_line_error(result, "nsqd 127.0.0.1:1", "nsqd 127.0.0.1:2")


def test_a_publish_that_fails_is_one_line_with_a_count_and_exits_1():
    topic = unique("cli_err")
    result = run_cli("pub", "--nsqd", NOWHERE, topic, input=b"one\ntwo\n")
    one_line_error(result, "published 0 messages", "2 failed", "first: <stdin> line 1")
    assert result.returncode == 1


def test_thousands_of_bad_lines_are_one_short_line_and_listed_by_json():
    # Not JSON, so no --key-field: every line fails on its own.
    lines = b"".join(b"x%d\n" % i for i in range(1, 5001))
    args = ["pub", "--nsqd", NOWHERE, "--key-field", "k", unique("cli_bad")]
    result = run_cli(*args, input=lines)
    line = one_line_error(result, "5000 failed", "<stdin> line 1: not JSON, so no --key-field k")
    assert len(line) < 300
    detailed = run_cli(*args, "--json", input=lines)
    assert detailed.returncode == 1 and detailed.stderr == b""
    *failures, summary = [json.loads(x) for x in detailed.stdout.splitlines()]
    assert len(failures) == 5000 and failures[41] == {
        "source": "<stdin>",
        "lines": "42",
        "error": "not JSON, so no --key-field k",
    }
    assert summary["failed"] == 5000 and summary["published"] == 0


def test_smartnsq_works_without_click_and_rich_and_does_not_load_the_cli():
    # Block them outright (installed here for the command line's own tests): smartnsq must
    # import and build clients without them, and leave its cli package alone.
    code = (
        "import sys; sys.modules['click'] = None; sys.modules['rich'] = None\n"
        "import smartnsq, smartnsq.lookup.manager\n"
        "smartnsq.Producer(['127.0.0.1:4150'])\n"
        "smartnsq.Consumer('t', 'c', nsqd_tcp_addresses=['a:1'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('smartnsq.cli')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True)
    assert out.stdout.strip() == b"[]"


def test_without_the_extra_the_command_says_what_to_install():
    # sys.modules[name] = None makes 'import name' fail as if it were not installed.
    code = (
        "import sys; sys.modules['click'] = None; sys.argv = ['smartnsq', 'stat'];"
        "import runpy; runpy.run_module('smartnsq', run_name='__main__')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, check=False)
    one_line_error(result, "pip install 'smartnsq[cli]'")


def test_a_duration_for_a_keyword_whose_default_is_none_is_parsed():
    """``msg_timeout`` defaults to None: its ``3s`` was passed on as text, and refused by
    the Consumer as "must be a number, not str"."""
    from smartnsq import Consumer
    from smartnsq.cli.words import pass_through

    opts = ["msg_timeout=3s", "heartbeat_interval=1500ms", "client_id=42"]
    assert pass_through("--consumer-opt", opts, Consumer, {}) == {
        "msg_timeout": 3.0,
        "heartbeat_interval": 1.5,
        "client_id": "42",
    }


def test_a_bad_consumer_opt_is_refused_before_any_nsqd_is_contacted():
    result = run_cli("tail", "--nsqd", NOWHERE, "--consumer-opt", "msg_timeout=soon", "t")
    line = one_line_error(result, "msg_timeout=soon")
    assert "cannot reach" not in line
