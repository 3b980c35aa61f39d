"""The pytest plugin for users (smartnsq.testing.plugin), run the way a user's suite runs it:
pytester writes a small test file and runs pytest on it, with real nsqd/nsqlookupd binaries
(compat's classic build) named through SMARTNSQ_NSQ_BIN_DIR."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from compat.servers import ensure_binaries
from smartnsq.testing import BIN_DIR_ENV
from smartnsq.testing._process import ephemeral_ports, free_port, pid_alive

USER_TESTS = """
import anyio
import pytest

from smartnsq import Consumer, Producer
from smartnsq.errors import NSQError
from smartnsq.testing import start_cluster


def record(name, *daemons):
    with open(name, "a") as f:
        f.writelines(f"{d.pid}\\n" for d in daemons)


def test_publish_then_consume_through_nsqd(nsqd):
    record("pids", nsqd)

    async def main():
        async with Producer(nsqd_tcp_addresses=[nsqd.tcp]) as producer:
            await producer.publish("events", b"hello")
        async with Consumer("events", "ch", nsqd_tcp_addresses=[nsqd.tcp]) as consumer:
            async for message in consumer:
                return message.body

    assert anyio.run(main) == b"hello"


def test_consume_through_lookupd(nsq_cluster, nsqd, nsqlookupd):
    record("pids", nsqd, nsqlookupd)
    assert nsq_cluster.nsqd_tcp_addresses == [nsqd.tcp]
    assert nsq_cluster.lookupd_http_addresses == [nsqlookupd.http]

    async def main():
        async with Producer(nsqd_tcp_addresses=[nsqd.tcp]) as producer:
            await producer.publish("orders", b"o1")
        async with Consumer(
            "orders", "ch", lookupd_http_addresses=[nsqlookupd.http]
        ) as consumer:
            async for message in consumer:
                return message.body

    assert anyio.run(main) == b"o1"


class TestOwnFlags:
    @pytest.fixture
    def nsqd_args(self):
        return ["--max-msg-size=16"]

    def test_nsqd_gets_them(self, nsqd):
        record("pids", nsqd)
        assert "--max-msg-size=16" in nsqd.argv

        async def main():
            async with Producer(nsqd_tcp_addresses=[nsqd.tcp]) as producer:
                await producer.publish("events", b"x" * 16)
                with pytest.raises(NSQError, match="(?i)too big"):
                    await producer.publish("events", b"x" * 17)

        anyio.run(main)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    with start_cluster(tmp_path_factory.mktemp("shared")) as cluster:
        yield cluster


@pytest.mark.parametrize("body", [b"one", b"two"])
def test_a_module_fixture_of_ones_own(shared, body):
    record("pids", *shared.nsqd, *shared.lookupd)

    async def main():
        async with Producer(nsqd_tcp_addresses=shared.nsqd_tcp_addresses) as producer:
            await producer.publish("shared", body)

    anyio.run(main)
"""


@pytest.fixture
def classic_bin_dir() -> Path:
    """compat's build of classic nsqd and nsqlookupd (cached per user after the first build)."""
    return ensure_binaries("classic")["nsqd"].parent


def test_user_tests_run_against_real_servers_that_stop_afterwards(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, classic_bin_dir: Path
) -> None:
    monkeypatch.setenv(BIN_DIR_ENV, str(classic_bin_dir))
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest()
    result.assert_outcomes(passed=5)
    pids = [int(p) for p in (pytester.path / "pids").read_text().split()]
    # a fresh nsqd for each of the first three tests, the lookupd of one of them, and the
    # module fixture's nsqd and nsqlookupd, shared by the last two
    assert len(pids) == 8 and len(set(pids)) == 6
    assert [p for p in pids if pid_alive(p)] == []


MISSING_TESTS = """
def test_without_servers():
    pass


def test_with_nsqd(nsqd):
    raise AssertionError("never runs")
"""


@pytest.mark.parametrize("where", ["bin dir", "PATH"])
def test_missing_binaries_give_one_clear_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    empty = pytester.mkdir("empty")
    if where == "bin dir":
        monkeypatch.setenv(BIN_DIR_ENV, str(empty))
        looked = f"nsqd and nsqlookupd not found in {BIN_DIR_ENV}={empty}."
    else:
        monkeypatch.delenv(BIN_DIR_ENV, raising=False)
        monkeypatch.setenv("PATH", str(empty))
        looked = f"nsqd and nsqlookupd not found on PATH ({BIN_DIR_ENV} is not set)."
    pytester.makepyfile(test_user=MISSING_TESTS)
    # -rN: no short summary, which (untruncated where CI is set) would repeat the message
    result = pytester.runpytest("-rN")
    # a test that asks for no server runs: nothing is looked up or started for it
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            f"*smartnsq.testing: {looked}",
            "*https://github.com/nsqio/nsq/releases*",
            "*go build -o bin/ ./apps/nsqd ./apps/nsqlookupd*",
        ]
    )
    out = result.stdout.str()
    # said once, not once more for a chained exception
    assert out.count("Put the NSQ server binaries") == 1
    assert "Traceback" not in out
    assert "never runs" not in out


def test_the_plugin_loads_without_the_posix_only_resource_module() -> None:
    # it is loaded into every pytest run where smartnsq is installed, Windows included
    code = "import sys; sys.modules['resource'] = None; import smartnsq.testing.plugin"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_plugin_is_registered_under_its_name(pytestconfig: pytest.Config) -> None:
    # loaded through the pytest11 entry point, next to compat's fixtures without a clash
    plugin = pytestconfig.pluginmanager.get_plugin("smartnsq")
    assert plugin is not None and plugin.__name__ == "smartnsq.testing.plugin"
    assert os.path.basename(plugin.__file__ or "") == "plugin.py"


def test_free_ports_are_outside_the_range_client_sockets_get() -> None:
    # A port in the ephemeral range can be given to any outgoing connection before the
    # daemon binds it (nsqd then dies of "address already in use").
    low, high = ephemeral_ports()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(1024 <= p < low for p in ports), (low, high, ports)
