"""tail's and to-file's --output-buffer-timeout / --output-buffer-size against a real nsqd:
the values reach nsqd in IDENTIFY (a value outside nsqd's limits comes back as its own
refusal, naming the value, and the command stops), a small timeout gets a low rate through
well inside nsqd's default 250 ms flush, and what no nsqd accepts is refused before anything
is sent."""

from __future__ import annotations

import time
import urllib.request

import pytest

from tests.cli.clihelp import LineReader, one_line_error, run_cli, spawn_cli
from tests.helpers import create_channel, unique

pytestmark = pytest.mark.integration


def _refusal(args: list[str], expected: str) -> None:
    """The command stops with nsqd's refusal of its IDENTIFY, on one line (it used to keep
    reconnecting, logging it)."""
    line = one_line_error(run_cli(*args, timeout=30), expected)
    assert "refuses this client's settings" in line


@pytest.mark.parametrize("command", ["tail", "to-file"])
def test_the_values_reach_nsqd_in_identify(classic_cluster, tmp_path, command):
    # nsqd's default limits: a timeout of at least 25 ms, a buffer of at most 64 KiB. Its
    # refusal quotes what IDENTIFY carried (milliseconds, bytes).
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_obuf")
    extra = ["--dir", str(tmp_path)] if command == "to-file" else []
    base = [command, "--nsqd", nsqd.tcp, *extra, topic]
    _refusal([*base, "--output-buffer-timeout", "2ms"], "output buffer timeout (2) is invalid")
    _refusal([*base, "--output-buffer-size", "100K"], "output buffer size (102400) is invalid")


def test_a_small_timeout_gets_a_low_rate_through_well_inside_250ms(classic_cluster):
    # With RDY to spare, nsqd writes a lone message out on its flush timer: 250 ms by default
    # (125 ms late on average); 25 ms with the flag.
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_obuf_rate")
    create_channel(nsqd.http, topic, "c")
    tail = spawn_cli(
        "tail", "--nsqd", nsqd.tcp, "--channel", "c", "--output-buffer-timeout", "25ms", topic
    )
    assert tail.stdout is not None
    lines = LineReader(tail.stdout)
    url = f"http://{nsqd.http}/pub?topic={topic}"
    # the first message also waits for the subscription: not timed
    urllib.request.urlopen(urllib.request.Request(url, b"start", method="POST"), timeout=10)
    lines.wait_for(1)
    latencies = []
    for i in range(8):
        sent = time.monotonic()
        request = urllib.request.Request(url, b"%d" % i, method="POST")
        urllib.request.urlopen(request, timeout=10)
        lines.wait_for(i + 2, timeout=5)
        latencies.append(time.monotonic() - sent)
    assert max(latencies) < 0.15, latencies


@pytest.mark.parametrize("command", ["tail", "to-file"])
@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--output-buffer-timeout", "0.5ms"], "--output-buffer-timeout must be 0"),
        (["--output-buffer-timeout", "soon"], "--output-buffer-timeout 'soon' is not a duration"),
        (["--output-buffer-size", "10"], "--output-buffer-size must be 0 (no buffering) or"),
        (["--output-buffer-size", "-1"], "--output-buffer-size '-1' is not a size"),
        # go-nsq's spelling (nsq_tail's, nsq_to_file's) is the flag, with the flag's checks.
        (["--consumer-opt", "output_buffer_size=10"], "--output-buffer-size must be 0 (no"),
        (["--consumer-opt=output-buffer-timeout=soon"], "--output-buffer-timeout 'soon' is not"),
    ],
)
def test_a_bad_value_is_refused_with_the_flag_name(tmp_path, command, flags, words):
    # An address nothing listens on: the refusal comes before any connection.
    extra = ["--dir", str(tmp_path)] if command == "to-file" else []
    result = run_cli(command, "--nsqd", "127.0.0.1:1", *extra, *flags, "t")
    assert result.returncode == 2
    one_line_error(result, words)
