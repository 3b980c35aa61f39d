"""Every ```python block of README.md and docs/ runs as pasted, against real servers.

Each block is one test (``path:line``), run as a subprocess with a timeout. The markers, one
HTML comment per line right before the fence (see tests/docs/snippets.py and
CONTRIBUTING.md's "Writing docs"):

    <!-- fragment: why --> not run, for the reason given (a library not installed)
    <!-- forever -->   runs until stopped: SIGINT once its consumer is subscribed; it must
                       then exit within STOP_TIMEOUT with status 0 or by KeyboardInterrupt;
                       under smartnsq.run / serve or a blocking Consumer's run(), with 0
                       and no traceback
    <!-- pytest -->    a test module: run with pytest and the smartnsq plugin's servers
    <!-- youzan -->    needs a Youzan HA cluster: skipped, with the reason, without the fork
    <!-- youzan-ext --> the same, its topics created as ext topics (headers, tags, compression)
    <!-- tls -->       runs against a classic nsqd that takes only TLS: its placeholder host
                       and certificate files are rewritten to the real ones, and
                       SSL_CERT_FILE names the test CA (the trust store of tls=True)
    <!-- auth -->      the same, the nsqd requiring AUTH from a local auth server that
                       accepts the block's secret
    <!-- spark -->     starts a local Spark session (Java 17): a longer timeout
                       (SPARK_TIMEOUT), its Python workers on this interpreter
    <!-- requeues -->  its handler fails on purpose (dead letters): requeues are expected

The standard addresses 127.0.0.1:4150/4151 (nsqd TCP/HTTP) and 127.0.0.1:4160/4161 (lookupd
TCP/HTTP) are rewritten to the cluster's. On the classic cluster, every topic is deleted before
each block and each topic a ``Consumer("…"`` in it reads is created and known to lookupd; after
it, no message may have been requeued or timed out (a failing handler requeues silently). On
the Youzan cluster, each topic it reads or publishes to is created with 2 partitions.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from compat.cluster import Cluster
from compat.servers import ensure_binaries
from tests.docs.snippets import (
    AUTH_SECRET,
    ROOT,
    TLS_FILES,
    TLS_NAMES,
    Snippet,
    SnippetError,
    all_snippets,
    extract,
    rewrite,
    rewrite_tls,
)
from tests.helpers import serve_auth, start_tls_cluster

RUN_TIMEOUT = 60.0  # seconds for a snippet that terminates; the longest sleeps 10 s
SPARK_TIMEOUT = 240.0
READY_TIMEOUT = 60.0  # for a "forever" snippet's consumer to subscribe
STOP_TIMEOUT = 20.0  # for it to exit after SIGINT
HTTP_TIMEOUT = 5.0

SNIPPETS = all_snippets()
RUNNABLE = [s for s in SNIPPETS if s.runnable]


def http(address: str, path: str, method: str = "GET") -> tuple[int, Any]:
    request = urllib.request.Request(f"http://{address}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as response:
            body = response.read()
            return response.status, json.loads(body) if body.strip() else None
    except urllib.error.HTTPError as exc:
        return exc.code, None


def wait_for(what: str, condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)  # a poll interval under a deadline, not a stand-in for a signal


def topics(cluster: Cluster) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for nsqd in cluster.nsqd:
        status, stats = http(nsqd.http, "/stats?format=json")
        assert status == 200, f"nsqd {nsqd.http} /stats answered {status}"
        found += stats.get("topics") or []
    return found


def reset(cluster: Cluster) -> None:
    """Delete every topic (their channels go with them): each snippet starts on a clean nsqd.

    lookupd forgets them too: nsqd creates a new topic with the channels lookupd still lists for
    it, and a channel left from an earlier snippet would take messages published before the
    snippet's own channel exists."""
    names: set[str] = set()
    for nsqd in cluster.nsqd:
        _, stats = http(nsqd.http, "/stats?format=json")
        for topic in stats.get("topics") or []:
            names.add(topic["topic_name"])
            name = urllib.parse.quote(topic["topic_name"])
            http(nsqd.http, f"/topic/delete?topic={name}", method="POST")
    for lookupd in cluster.lookupd:
        _, listed = http(lookupd.http, "/topics")
        for topic in names | set((listed or {}).get("topics") or []):
            name = urllib.parse.quote(topic)
            http(lookupd.http, f"/topic/delete?topic={name}", method="POST")


def prepare_classic(cluster: Cluster, snippet: Snippet) -> None:
    for topic in snippet.topics_consumed():
        name = urllib.parse.quote(topic)
        status, _ = http(cluster.nsqd[0].http, f"/topic/create?topic={name}", method="POST")
        assert status == 200, f"creating topic {topic!r} answered {status}"
        for lookupd in cluster.lookupd:
            wait_for(
                f"lookupd {lookupd.http} to list topic {topic!r}",
                lambda lookupd=lookupd, name=name: (
                    http(lookupd.http, f"/lookup?topic={name}")[0] == 200
                ),
                READY_TIMEOUT,
            )


def prepare_youzan(cluster: Cluster, snippet: Snippet) -> None:
    from compat.youzan import create_topic

    published = re.findall(r"\bpublish(?:_many)?\(\s*[\"']([\w.#-]+)[\"']", snippet.code)
    for topic in sorted(set(snippet.topics_consumed()) | set(published)):
        create_topic(cluster, topic, partitions=2, replicas=1, ext="youzan-ext" in snippet.markers)


def addresses(cluster: Cluster) -> dict[str, str]:
    return {
        "nsqd_tcp": cluster.nsqd[0].tcp,
        "nsqd_http": cluster.nsqd[0].http,
        "lookupd_tcp": cluster.lookupd[0].tcp,
        "lookupd_http": cluster.lookupd[0].http,
    }


def environment(**extra: str) -> dict[str, str]:
    # The checkout first on sys.path: the snippet tests this checkout's smartnsq.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **extra}


def report(snippet: Snippet, what: str, stdout: str, stderr: str) -> str:
    return f"{snippet.id} {what}\n--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-5000:]}"


def assert_no_failed_messages(cluster: Cluster, snippet: Snippet) -> None:
    failed = [
        (t["topic_name"], c["channel_name"], c["requeue_count"], c["timeout_count"])
        for t in topics(cluster)
        for c in t.get("channels") or []
        if c["requeue_count"] or c["timeout_count"]
    ]
    assert not failed, (
        f"{snippet.id}: messages were requeued or timed out (a handler failed?): "
        f"(topic, channel, requeued, timed out) {failed}"
    )


def subscribed(cluster: Cluster) -> bool:
    return any(c.get("clients") for t in topics(cluster) for c in t.get("channels") or [])


def only_keyboard_interrupt(stderr: str) -> bool:
    """Whether every traceback on stderr ends in KeyboardInterrupt (or the CancelledError that
    asyncio chains before it): Ctrl-C out of ``anyio.run`` prints one; nothing else may."""
    if "Traceback" not in stderr:
        return True  # log lines ("INFO:smartnsq...") are not exceptions
    ends = [
        line.strip()
        for line in stderr[stderr.index("Traceback") :].splitlines()
        if line and not line[0].isspace() and re.match(r"[\w.]+(:|$)", line)
    ]
    allowed = {"KeyboardInterrupt", "asyncio.exceptions.CancelledError", "CancelledError"}
    return all(end.split(":")[0] in allowed for end in ends) and (
        not ends or ends[-1] == "KeyboardInterrupt"
    )


def run_forever(cluster: Cluster, snippet: Snippet, script: Path, env: dict[str, str]) -> None:
    process = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=script.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while not subscribed(cluster):
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                out, err = process.communicate()
                what = "exited before" if process.returncode != -9 else "timed out before"
                pytest.fail(report(snippet, f"{what} its consumer subscribed", out, err))
            time.sleep(0.05)  # polls nsqd under a deadline
        process.send_signal(signal.SIGINT)
        try:
            out, err = process.communicate(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
            what = f"did not exit {STOP_TIMEOUT:.0f} s after SIGINT"
            pytest.fail(report(snippet, what, out, err))
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    if stops_gracefully(snippet):
        # smartnsq.run / serve and the blocking Consumer.run promise a clean exit on SIGINT.
        assert process.returncode == 0, report(
            snippet, f"exited with {process.returncode} after SIGINT, not 0", out, err
        )
        assert "Traceback" not in err, report(snippet, "printed a traceback", out, err)
    assert process.returncode in (0, -signal.SIGINT), report(
        snippet, f"exited with {process.returncode} after SIGINT", out, err
    )
    assert only_keyboard_interrupt(err), report(snippet, "printed a traceback", out, err)


def stops_gracefully(snippet: Snippet) -> bool:
    """Whether the block runs under smartnsq.run / serve or a blocking Consumer's run()."""
    return bool(re.search(r"\bsmartnsq\.(run|serve)\(|\)\.run\(\)", snippet.code))


def run_pytest(snippet: Snippet, script: Path) -> None:
    bin_dir = ensure_binaries("classic")["nsqd"].parent
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", script.name],
        cwd=script.parent,
        env=environment(SMARTNSQ_NSQ_BIN_DIR=str(bin_dir)),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT * 2,
    )
    assert result.returncode == 0, report(snippet, "failed", result.stdout, result.stderr)
    assert re.search(r"\b\d+ passed\b", result.stdout), result.stdout
    assert not re.search(r"\b(skipped|xfailed|deselected)\b", result.stdout), result.stdout


def spark_environment() -> dict[str, str]:
    """A Spark snippet's session is local: its Python workers run this interpreter (which has
    smartnsq, pyspark and pyarrow), on loopback; a missing Java fails with what to install."""
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.fail(
            "Java is missing: the Spark snippets need Java 17 (`./dev setup` installs Debian's "
            "openjdk-17-jre-headless as root)"
        )
    return environment(
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
    )


def run_once(snippet: Snippet, script: Path, env: dict[str, str]) -> None:
    spark = "spark" in snippet.markers
    timeout = SPARK_TIMEOUT if spark else RUN_TIMEOUT
    try:
        result = subprocess.run(
            [sys.executable, str(script)],
            cwd=script.parent,
            env={**spark_environment(), **env} if spark else env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        pytest.fail(report(snippet, f"did not finish within {timeout:.0f} s", out, err))
    print(report(snippet, "output (pytest -rP shows it)", result.stdout, result.stderr))
    assert result.returncode == 0, report(
        snippet, f"exited with {result.returncode}", result.stdout, result.stderr
    )
    assert "Traceback" not in result.stderr, report(
        snippet, "printed a traceback", result.stdout, result.stderr
    )


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[trustme.CA, dict[str, str]]:
    """The test CA, and the files the tls blocks' placeholders stand for (keyed as TLS_FILES)."""
    ca = trustme.CA()
    directory = tmp_path_factory.mktemp("docs-tls")
    client = ca.issue_cert("client.example.com")
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    client.cert_chain_pems[0].write_to_path(str(directory / "client.pem"))
    client.private_key_pem.write_to_path(str(directory / "client.key"))
    files = {
        "ca": str(directory / "ca.pem"),
        "cert": str(directory / "client.pem"),
        "key": str(directory / "client.key"),
    }
    assert set(files) == set(TLS_FILES.values())
    return ca, files


@pytest.fixture(scope="module")
def tls_cluster(
    tmp_path_factory: pytest.TempPathFactory, tls_files: tuple[trustme.CA, dict[str, str]]
) -> Iterator[Cluster]:
    directory = tmp_path_factory.mktemp("docs-tls-nsqd")
    cluster: Cluster = start_tls_cluster(tls_files[0], directory, names=TLS_NAMES)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def auth_cluster(
    tmp_path_factory: pytest.TempPathFactory, tls_files: tuple[trustme.CA, dict[str, str]]
) -> Iterator[Cluster]:
    with serve_auth(AUTH_SECRET, identity="docs") as address:
        directory = tmp_path_factory.mktemp("docs-auth-nsqd")
        auth = f"--auth-http-address={address}"
        cluster: Cluster = start_tls_cluster(tls_files[0], directory, auth, names=TLS_NAMES)
        try:
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture
def cluster_for(request: pytest.FixtureRequest) -> Iterator[Callable[[Snippet], Cluster]]:
    """The cluster a snippet runs on: the module's classic one, a TLS (and AUTH) one, or a
    Youzan one."""

    def get(snippet: Snippet) -> Cluster:
        if snippet.youzan:
            kind = "youzan_cluster"
        elif "auth" in snippet.markers:
            kind = "auth_cluster"
        elif "tls" in snippet.markers:
            kind = "tls_cluster"
        else:
            kind = "classic_cluster"
        cluster: Cluster = request.getfixturevalue(kind)
        return cluster

    yield get


def tls_environment(
    request: pytest.FixtureRequest, snippet: Snippet, cluster: Cluster, code: str
) -> tuple[str, dict[str, str]]:
    """A tls or auth block's code with its placeholders rewritten, and its environment."""
    if not snippet.tls:
        return code, environment()
    files: dict[str, str] = request.getfixturevalue("tls_files")[1]
    env = environment(SSL_CERT_FILE=files["ca"], NSQ_AUTH_SECRET=AUTH_SECRET)
    return rewrite_tls(code, cluster.nsqd[0].tcp, files), env


@pytest.mark.integration
@pytest.mark.parametrize("snippet", RUNNABLE, ids=[s.id for s in RUNNABLE])
def test_snippet_runs_as_pasted(
    snippet: Snippet,
    cluster_for: Callable[[Snippet], Cluster],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    if "pytest" in snippet.markers:
        script = tmp_path / "test_snippet.py"
        script.write_text(snippet.code)
        run_pytest(snippet, script)
        return
    cluster = cluster_for(snippet)
    youzan = snippet.youzan
    script = tmp_path / "snippet.py"
    code = rewrite(snippet.code, addresses(cluster))
    code, env = tls_environment(request, snippet, cluster, code)
    script.write_text(code)
    if not youzan:
        reset(cluster)
    try:
        (prepare_youzan if youzan else prepare_classic)(cluster, snippet)
        if "forever" in snippet.markers:
            run_forever(cluster, snippet, script, env)
        else:
            run_once(snippet, script, env)
        if not youzan and "requeues" not in snippet.markers:
            assert_no_failed_messages(cluster, snippet)
    finally:
        if not youzan:
            reset(cluster)


# The extraction itself.


def test_every_page_has_been_searched() -> None:
    paths = {s.path for s in SNIPPETS}
    assert {"README.md", "docs/quickstart.md", "docs/blocking.md"} <= paths, paths
    assert len(RUNNABLE) >= 15, [s.id for s in RUNNABLE]


def test_markers_and_fragments_are_read() -> None:
    text = (
        "intro\n```python\nprint(1)\n```\n"
        "<!-- fragment: x is elsewhere -->\n```python\nawait x\n```\n"
        "<!-- forever -->\n<!-- spark -->\n```python\nrun()\n```\n"
        "- item\n\n  ```python\n  Consumer('t', 'c')\n  ```\n"
    )
    found = extract(text, "page.md")
    assert [(s.line, s.runnable, sorted(s.markers)) for s in found] == [
        (2, True, []),
        (6, False, ["fragment"]),
        (11, True, ["forever", "spark"]),
        (16, True, []),
    ]
    assert found[1].reason == "x is elsewhere"
    assert found[3].code == "Consumer('t', 'c')\n"
    assert found[3].topics_consumed() == ["t"]


def test_an_unknown_marker_or_an_unclosed_fence_is_an_error() -> None:
    with pytest.raises(SnippetError, match="unknown snippet marker 'fragmnet'"):
        extract("<!-- fragmnet -->\n```python\nx\n```\n", "p.md")
    with pytest.raises(SnippetError, match="never closed"):
        extract("```python\nx\n", "p.md")
    with pytest.raises(SnippetError, match="says why it cannot run"):
        extract("<!-- fragment -->\n```python\nx\n```\n", "p.md")
    with pytest.raises(SnippetError, match="only a fragment takes a reason"):
        extract("<!-- spark: slow -->\n```python\nx\n```\n", "p.md")


def test_every_spark_block_runs_under_the_spark_marker() -> None:
    uses_spark = [s for s in SNIPPETS if re.search(r"\bpyspark\b|\bspark\.(read|sql)", s.code)]
    assert uses_spark, "no page shows Spark code any more: drop this test"
    unmarked = [s.id for s in uses_spark if not s.runnable or "spark" not in s.markers]
    assert not unmarked, f"Spark blocks that do not run under <!-- spark -->: {unmarked}"


def test_only_a_keyboard_interrupt_is_accepted_after_sigint() -> None:
    assert only_keyboard_interrupt("")
    assert only_keyboard_interrupt("INFO:smartnsq.consumer:subscribed\n")
    chained = (
        "Traceback (most recent call last):\n  File x\nasyncio.exceptions.CancelledError\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n  File y\nKeyboardInterrupt\n"
    )
    assert only_keyboard_interrupt(chained)
    assert not only_keyboard_interrupt(chained.replace("KeyboardInterrupt", "NameError: x"))
    assert not only_keyboard_interrupt(
        "Traceback (most recent call last):\n  File z\nValueError: bad\n\n" + chained
    )


def test_graceful_stops_are_recognised() -> None:
    def snippet(code: str) -> Snippet:
        return Snippet("p.md", 1, code, frozenset({"forever"}))

    assert stops_gracefully(snippet("smartnsq.run(consumer, stop_timeout=10)"))
    assert stops_gracefully(snippet("    await smartnsq.serve(consumer, producer)"))
    assert stops_gracefully(snippet('Consumer("t", "c", handle,\n         x=1).run()'))
    assert not stops_gracefully(snippet("anyio.run(main)"))


def test_standard_addresses_are_rewritten_and_nothing_else() -> None:
    real = {"nsqd_tcp": "A", "nsqd_http": "B", "lookupd_tcp": "C", "lookupd_http": "D"}
    code = (
        '["127.0.0.1:4150"] "http://127.0.0.1:4161" 127.0.0.1:4151 127.0.0.1:4160 '
        "127.0.0.1:41500 227.0.0.1:4150 127.0.0.1:4152"
    )
    assert rewrite(code, real) == (
        '["A"] "http://D" B C 127.0.0.1:41500 227.0.0.1:4150 127.0.0.1:4152'
    )


def test_tls_placeholders_are_rewritten() -> None:
    files = {"ca": "/t/ca.pem", "cert": "/t/c.pem", "key": "/t/c.key"}
    code = (
        'Producer(["nsqd.example.com:4150"]) cafile="/etc/nsq/ca.pem" '
        '("/etc/nsq/client.pem", "/etc/nsq/client.key") tls_hostname="nsqd.internal"'
    )
    assert rewrite_tls(code, "127.0.0.1:9", files) == (
        'Producer(["127.0.0.1:9"]) cafile="/t/ca.pem" '
        '("/t/c.pem", "/t/c.key") tls_hostname="nsqd.internal"'
    )
