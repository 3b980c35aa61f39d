"""Problems are visible in a program that configured no logging (real nsqd and lookupd).

Each case runs a small script in a fresh interpreter, as a user's program would run, and
looks at what it printed on stderr.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from smartnsq.notice import heard
from tests.helpers import create_channel, unique

ROOT = Path(__file__).resolve().parent.parent

HANDLER_FAILS = """
import logging, sys
import anyio
from smartnsq import Consumer, Producer

nsqd, topic, configure = sys.argv[1], sys.argv[2], sys.argv[3] == "yes"
if configure:
    logging.basicConfig(level=logging.WARNING)

async def main():
    done = anyio.Event()
    calls = 0

    async def handle(m):
        nonlocal calls
        calls += 1
        if calls == 3:
            done.set()
        m.requeue(time_ms=1000)  # a pynsq habit: TypeError inside the handler

    async with Producer([nsqd]) as p:
        await p.publish(topic, b"x")
    async with Consumer(topic, "c", handle, nsqd_tcp_addresses=[nsqd], requeue_delay=0,
                        backoff=False):
        with anyio.fail_after(30):
            await done.wait()
    print("handled", calls)

anyio.run(main)
"""

TOPIC_MISSING = """
import sys, threading, warnings
import anyio
from smartnsq import Consumer, Producer

nsqd, lookupd, topic = sys.argv[1], sys.argv[2], sys.argv[3]
shown = threading.Event()
show = warnings.showwarning

def showwarning(*args, **kwargs):  # prints as usual, and lets the script go on
    show(*args, **kwargs)
    shown.set()

warnings.showwarning = showwarning

async def main():
    got = anyio.Event()

    async def handle(m):
        got.set()

    async with Consumer(topic, "c", handle, lookupd_http_addresses=[lookupd],
                        lookupd_poll_interval=0.5):
        with anyio.fail_after(30):
            while not shown.is_set():
                await anyio.sleep(0.05)
        # it keeps waiting: once the topic exists, its message arrives
        async with Producer([nsqd]) as p:
            await p.publish(topic, b"x")
        with anyio.fail_after(30):
            await got.wait()
    print("received")

anyio.run(main)
"""


def run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.integration
def test_a_failing_handler_is_shown_once_without_logging(classic_cluster: Any) -> None:
    nsqd = classic_cluster.nsqd[0]
    done = run(HANDLER_FAILS, nsqd.tcp, unique("notice_h"), "no")
    assert done.returncode == 0, done.stderr
    assert "handled 3" in done.stdout
    # three failures, one notice, naming the exception and what to do
    assert done.stderr.count("UnloggedWarning") == 1, done.stderr
    assert "TypeError" in done.stderr and "time_ms" in done.stderr
    assert "logging.basicConfig()" in done.stderr


@pytest.mark.integration
def test_no_notice_when_logging_is_configured(classic_cluster: Any) -> None:
    nsqd = classic_cluster.nsqd[0]
    done = run(HANDLER_FAILS, nsqd.tcp, unique("notice_l"), "yes")
    assert done.returncode == 0, done.stderr
    assert "UnloggedWarning" not in done.stderr
    # every failure is in the log, with its traceback
    assert done.stderr.count("handler failed for message") == 3, done.stderr
    assert done.stderr.count("TypeError") >= 3


@pytest.mark.integration
def test_a_missing_topic_is_said_once_and_the_consumer_keeps_waiting(
    classic_cluster: Any,
) -> None:
    nsqd, lookupd = classic_cluster.nsqd[0], classic_cluster.lookupd[0]
    topic = unique("notice_t")
    done = run(TOPIC_MISSING, nsqd.tcp, lookupd.http, topic)
    assert done.returncode == 0, done.stderr
    assert "received" in done.stdout
    assert done.stderr.count("UnloggedWarning") == 1, done.stderr
    assert "TOPIC_NOT_FOUND" in done.stderr and topic in done.stderr


def test_heard_follows_the_handlers_a_record_would_reach() -> None:
    parent = logging.getLogger("notice_test")
    child = logging.getLogger("notice_test.child")
    parent.propagate = False
    try:
        parent.addHandler(logging.NullHandler())
        assert not heard(child)  # a NullHandler shows nothing
        handler = logging.StreamHandler()
        handler.setLevel(logging.ERROR)
        parent.addHandler(handler)
        assert not heard(child)  # it would drop a WARNING
        assert heard(child, logging.ERROR)
        child.setLevel(logging.CRITICAL)
        assert heard(child)  # silenced on purpose
    finally:
        parent.handlers.clear()
        parent.propagate = True
        child.setLevel(logging.NOTSET)


REFUSED_LATER = """
import sys
import anyio
from smartnsq import Producer
from smartnsq.errors import ConfigRefused

nsqd, topic = sys.argv[1], sys.argv[2]

async def main():
    async with Producer([nsqd]) as producer:
        await producer.publish(topic, b"before")
        print("published", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)  # nsqd restarts meanwhile
        refused = 0
        for _ in range(3):
            try:
                await producer.publish(topic, b"after")
            except ConfigRefused:
                refused += 1
        print("refused", refused, flush=True)

anyio.run(main)
"""


@pytest.mark.integration
def test_settings_refused_after_they_were_accepted_are_said_once_without_logging(
    cluster_factory: Any, tmp_path: Path
) -> None:
    """nsqd restarted with AUTH required: the producer's settings (no auth_secret) are
    refused now; three publishes raise ConfigRefused, one notice says why."""
    import signal

    cluster = cluster_factory("classic", nsqd=1)
    nsqd = cluster.nsqd[0]
    proc = subprocess.Popen(
        [sys.executable, "-c", REFUSED_LATER, nsqd.tcp, unique("notice_r")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline() == "published\n"
        cluster.kill_nsqd(0, signal.SIGTERM)
        # nsqd asks this address for AUTH; it is never reached: the client has no secret.
        nsqd.argv.append("--auth-http-address=127.0.0.1:1")
        cluster.restart_nsqd(0)
        out, err = proc.communicate("go\n", timeout=60)
    finally:
        proc.kill()
    assert "refused 3" in out, (out, err)
    assert err.count("UnloggedWarning") == 1, err
    assert "took these settings before" in err and "auth_secret" in err


DEAD_LETTER_REFUSED = """
import sys
import anyio
from smartnsq import Consumer, Producer

nsqd, lookupd, topic, dead = sys.argv[1:5]

async def main():
    gave_up = []

    async def handle(m):
        raise ValueError("poison")

    async with Producer([nsqd]) as p:
        await p.publish_many(topic, [b"x" * 200, b"y" * 200])
    async with Consumer(topic, "c", handle, lookupd_http_addresses=[lookupd], max_in_flight=2,
                        max_attempts=1, requeue_delay=0, backoff=False, dead_letter_topic=dead,
                        on_giving_up=lambda m, reason: gave_up.append(reason)):
        with anyio.fail_after(30):
            while len(gave_up) < 2:
                await anyio.sleep(0.05)
    print("gave up", len(gave_up), type(gave_up[0]).__name__)

anyio.run(main)
"""


@pytest.mark.integration
def test_a_refused_dead_letter_copy_is_shown_once_without_logging(cluster_factory: Any) -> None:
    cluster = cluster_factory("classic", nsqd=1)
    source = cluster.nsqd[0]
    sink = cluster.add_nsqd(["--max-msg-size=100"])  # refuses the copies: E_BAD_MESSAGE
    topic, dead = unique("notice_d"), unique("notice_dead")
    for nsqd, name in ((source, topic), (sink, dead)):
        create_channel(nsqd.http, name, "c")
    done = run(DEAD_LETTER_REFUSED, source.tcp, cluster.lookupd[0].http, topic, dead)
    assert done.returncode == 0, done.stderr
    assert "gave up 2 BadMessage" in done.stdout
    # one notice for the failing handler, one for the two refused copies
    assert done.stderr.count("UnloggedWarning") == 2, done.stderr
    assert done.stderr.count(f"dead-letter topic {dead} refused") == 1, done.stderr
