"""Address flags override the environment; --key-field works alike through --nsqd and
--lookupd on classic nsqd; errors name the command line's flags."""

from __future__ import annotations

import json

import pytest

from tests.cli.clihelp import addresses, cli_env, lines_of, one_line_error, run_cli
from tests.helpers import create_channel, topic_stats, unique

pytestmark = pytest.mark.integration

NOWHERE = "127.0.0.1:1"


def _count(nsqd_http: str, topic: str) -> int:
    return int((topic_stats(nsqd_http, topic) or {}).get("message_count", 0))


def test_nsqd_flag_is_used_when_nsq_lookupd_is_set(classic_cluster):
    # Through lookupd a new topic does not exist yet; --nsqd alone creates it.
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_env_nsqd")
    env = cli_env(NSQ_LOOKUPD=classic_cluster.lookupd[0].http)
    pub = run_cli("pub", "--nsqd", nsqd.tcp, topic, input=b"hello\n", env=env)
    assert pub.returncode == 0, pub.stderr
    assert _count(nsqd.http, topic) == 1


def test_lookupd_flag_is_used_when_nsq_nsqd_is_set(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_env_lookupd")
    create_channel(nsqd.http, topic, "c")
    assert run_cli("pub", "--nsqd", nsqd.tcp, topic, input=b"one\n").returncode == 0
    env = cli_env(NSQ_NSQD=NOWHERE)
    args = ["tail", *addresses(classic_cluster), "--channel", "c", "-n", "1", topic]
    tail = run_cli(*args, env=env)
    assert tail.returncode == 0 and tail.stdout == b"one\n", tail.stderr
    assert NOWHERE.encode() not in tail.stderr  # the environment's nsqd was not tried


def test_environment_is_used_when_no_address_flag_is_given(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_env_only")
    pub = run_cli("pub", topic, input=b"x\n", env=cli_env(NSQ_NSQD=nsqd.tcp))
    assert pub.returncode == 0, pub.stderr
    assert _count(nsqd.http, topic) == 1


@pytest.mark.parametrize("via", ["nsqd", "lookupd"])
def test_key_field_behaves_the_same_through_nsqd_and_lookupd_on_classic(classic_cluster, via):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_keyfield")
    create_channel(nsqd.http, topic, "c")  # lookupd knows the topic from now on
    where = addresses(classic_cluster, lookupd=via == "lookupd", nsqd=via == "nsqd")
    lines = lines_of('{"user": "a", "n": 1}', '{"user": "b", "n": 2}', '{"user": "a", "n": 3}')
    pub = run_cli("pub", *where, "--key-field", "user", "--json", topic, input=lines)
    assert pub.returncode == 0, pub.stderr
    assert json.loads(pub.stdout)["published"] == 3
    assert _count(nsqd.http, topic) == 3
    # A line without the field is an error either way: the key is read before routing.
    bad = run_cli("pub", *where, "--key-field", "user", topic, input=b'{"n": 4}\n')
    one_line_error(bad, "no field 'user'")


def test_errors_name_the_command_line_flags():
    result = run_cli("pub", "--nsqd", "tls://127.0.0.1:4150", "t", input=b"x\n")
    line = one_line_error(result, "--tls")
    assert "tls=True" not in line


def test_producer_opt_names_the_flag_that_sets_a_reserved_keyword():
    result = run_cli("pub", "--nsqd", NOWHERE, "--producer-opt", "tls=true", "t")
    one_line_error(result, "--producer-opt", "--tls")
    result = run_cli("pub", "--nsqd", NOWHERE, "--producer-opt", "nope=1", "t")
    one_line_error(result, "unknown option 'nope'", "max_retries")
