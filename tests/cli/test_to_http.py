"""to-http against real nsqd and real local HTTP servers: FIN only after a 2xx, the rest
requeued and delivered later; GET and POST; several URLs in turn or every URL."""

from __future__ import annotations

import http.server
import json
import signal
import threading
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.cli.clihelp import lines_of, one_line_error, run_cli, spawn_cli, wait_exit
from tests.helpers import channel_stats, create_channel, unique, unused_address, wait_for

pytestmark = pytest.mark.integration

# Quick retries: nsqd gives a requeued message back after this, and backoff stays short.
FAST_RETRY = ["--consumer-opt", "requeue_delay=0.05", "--consumer-opt", "backoff_unit=0.01"]


@dataclass
class Endpoint:
    """A threaded HTTP server on 127.0.0.1 that answers ``fail_status`` to its first
    ``failures`` requests, then 200; it records every request."""

    failures: int = 0
    fail_status: int = 503
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> int:
        with self.lock:
            status = self.fail_status if len(self.requests) < self.failures else 200
            path_only, _, query = path.partition("?")
            self.requests.append(
                {
                    "method": method,
                    "path": path_only,
                    "query": dict(urllib.parse.parse_qsl(query)),
                    "headers": headers,
                    "body": body,
                    "status": status,
                }
            )
        return status

    def delivered(self, key: str = "body") -> list[Any]:
        """What was answered 200: bodies (POST) or the ``key`` query argument (GET)."""
        with self.lock:
            done = [r for r in self.requests if r["status"] == 200]
        if key == "body":
            return [r["body"].decode() for r in done]
        return [r["query"][key] for r in done]

    def refused(self) -> list[bytes]:
        with self.lock:
            return [r["body"] for r in self.requests if r["status"] != 200]


@contextmanager
def endpoint(failures: int = 0, path: str = "/in") -> Iterator[Endpoint]:
    state = Endpoint(failures)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()}
            status = state.answer(self.command, self.path, headers, body)
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b"ok")

        do_GET = do_POST = answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 256

    server = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}{path}"
    try:
        yield state
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def _publish(nsqd: Any, topic: str, channel: str, bodies: list[str]) -> None:
    create_channel(nsqd.http, topic, channel)
    assert run_cli("pub", "--nsqd", nsqd.tcp, topic, input=lines_of(*bodies)).returncode == 0


def _all_finished(nsqd: Any, topic: str, channel: str, count: int) -> None:
    stats = channel_stats(nsqd.http, topic, channel)
    assert stats is not None
    assert stats["message_count"] == count
    assert (stats["depth"], stats["in_flight_count"], stats["deferred_count"]) == (0, 0, 0)


def test_post_finishes_only_after_2xx_and_delivers_the_refused_ones_later(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_http")
    bodies = [f"event {i} & more" for i in range(60)]
    _publish(nsqd, topic, "web", bodies)
    with endpoint(failures=25) as web:
        result = run_cli(
            "to-http", topic, "--nsqd", nsqd.tcp, "--channel", "web", "--post", web.url,
            "--content-type", "application/json", "--header", "X-Source: nsq",
            "--limit", "60", "--json", "--status-every", "0", *FAST_RETRY,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        assert summary["delivered"] == 60 and summary["failed_requests"] == 25
        assert summary["last_error"].endswith("got status code 503")
        # Nothing lost: every body answered 200; the 25 refused ones among them, later.
        assert sorted(web.delivered()) == sorted(bodies)
        assert len(web.refused()) == 25
        assert {r["method"] for r in web.requests} == {"POST"}
        assert {r["path"] for r in web.requests} == {"/in"}
        assert {r["headers"]["content-type"] for r in web.requests} == {"application/json"}
        assert {r["headers"]["x-source"] for r in web.requests} == {"nsq"}
    _all_finished(nsqd, topic, "web", 60)
    stats = channel_stats(nsqd.http, topic, "web")
    assert stats is not None and stats["requeue_count"] == 25


def test_a_failing_endpoint_finishes_nothing_and_sigterm_exits_143(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_http")
    _publish(nsqd, topic, "web", [f"m{i}" for i in range(30)])
    with endpoint(failures=10**9, path="/down") as web:
        proc = spawn_cli(
            "to-http", topic, "--nsqd", nsqd.tcp, "--channel", "web", "--post", web.url,
            "--json", *FAST_RETRY,
        )  # fmt: skip
        wait_for(lambda: len(web.requests) >= 30, what="each message tried at least once")
        proc.send_signal(signal.SIGTERM)
        assert wait_exit(proc) == 143
    summary = json.loads(proc.stdout.read())  # type: ignore[union-attr]
    assert summary["delivered"] == 0 and summary["exit_status"] == 143
    kept = channel_stats(nsqd.http, topic, "web")
    assert kept is not None and kept["message_count"] == 30
    assert kept["depth"] + kept["deferred_count"] + kept["in_flight_count"] == 30


def test_get_puts_the_url_encoded_body_in_the_url_and_sigint_exits_130(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_http")
    bodies = [f"a b&c=d/é {i}" for i in range(20)]
    _publish(nsqd, topic, "web", bodies)
    with endpoint(failures=3, path="/hit") as web:
        proc = spawn_cli(
            "to-http", "--topic", topic, "--nsqd", nsqd.tcp, "--channel", "web",
            "--get", web.url + "?src=nsq&msg=%s", "--json", *FAST_RETRY,
        )  # fmt: skip
        wait_for(lambda: len(web.delivered("msg")) >= 20, what="every message delivered")
        wait_for(lambda: (channel_stats(nsqd.http, topic, "web") or {}).get("depth") == 0
                 and channel_stats(nsqd.http, topic, "web")["in_flight_count"] == 0,
                 what="every message finished")  # fmt: skip
        proc.send_signal(signal.SIGINT)
        assert wait_exit(proc) == 130
        assert sorted(web.delivered("msg")) == sorted(bodies)
        assert {r["query"]["src"] for r in web.requests} == {"nsq"}
        assert {r["method"] for r in web.requests} == {"GET"}
        assert "content-type" not in web.requests[0]["headers"]
    assert json.loads(proc.stdout.read())["delivered"] == 20  # type: ignore[union-attr]
    _all_finished(nsqd, topic, "web", 20)


def test_round_robin_takes_the_urls_in_turn(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_http")
    bodies = [f"rr{i}" for i in range(30)]
    _publish(nsqd, topic, "web", bodies)
    with endpoint() as a, endpoint() as b, endpoint() as c:
        result = run_cli(
            "to-http", topic, "--nsqd", nsqd.tcp, "--channel", "web", "--mode", "round-robin",
            "--post", a.url, "--post", b.url, "--post", c.url, "--limit", "30", "--json",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert [len(e.delivered()) for e in (a, b, c)] == [10, 10, 10]
        assert sorted(a.delivered() + b.delivered() + c.delivered()) == sorted(bodies)
    _all_finished(nsqd, topic, "web", 30)


def test_mode_all_delivers_every_message_to_every_url(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_http")
    bodies = [f"all{i}" for i in range(25)]
    _publish(nsqd, topic, "web", bodies)
    with endpoint() as a, endpoint(failures=8) as b:
        result = run_cli(
            "to-http", topic, "--nsqd", nsqd.tcp, "--channel", "web", "--mode", "all",
            "--post", a.url, "--post", b.url, "--limit", "25", "--json", *FAST_RETRY,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        # b refused 8: those messages were requeued and sent to both again (at least once).
        assert sorted(set(a.delivered())) == sorted(set(b.delivered())) == sorted(bodies)
        assert sorted(b.delivered()) == sorted(bodies)
        again = Counter(a.delivered()) - Counter(bodies)
        assert sum(again.values()) == 8
    _all_finished(nsqd, topic, "web", 25)


def test_hostpool_leaves_a_failing_url_aside(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_http")
    bodies = [f"hp{i}" for i in range(20)]
    _publish(nsqd, topic, "web", bodies)
    with endpoint() as good:
        result = run_cli(
            "to-http", topic, "--nsqd", nsqd.tcp, "--channel", "web", "-n", "1",
            "--post", f"http://{unused_address()}/x", "--post", good.url,
            "--limit", "20", "--json", *FAST_RETRY,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        # The refusing URL was tried once, then left aside for 30 s: the rest went to good.
        assert summary["failed_requests"] == 1, summary
        assert sorted(good.delivered()) == sorted(bodies)
    _all_finished(nsqd, topic, "web", 20)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--get", "http://127.0.0.1:1/"], ["one '%s'"]),
        (["--get", "http://127.0.0.1:1/%s", "--post", "http://127.0.0.1:1/"], ["not both"]),
        ([], ["--get URL or --post URL"]),
        (["--get", "http://127.0.0.1:1/%s", "--content-type", "a/b"], ["--content-type"]),
        (["--post", "ftp://127.0.0.1:1/"], ["--post", "need http(s)://"]),
        (["--post", "http://127.0.0.1:1/", "--header", "nocolon"], ["NAME: VALUE"]),
        (["--post", "http://127.0.0.1:1/", "--consumer-opt", "max_attempts=3"],
         ["dead_letter_topic"]),
    ],
)  # fmt: skip
def test_to_http_bad_input_is_one_line_before_connecting(args, needles):
    one_line_error(run_cli("to-http", "t", "--nsqd", "127.0.0.1:1", *args), *needles)


def test_sample_zero_finishes_every_message_unsent(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("cli_http")
    _publish(nsqd, topic, "web", [f"s{i}" for i in range(10)])
    with endpoint() as web:
        proc = spawn_cli(
            "to-http", topic, "--nsqd", nsqd.tcp, "--channel", "web", "--post", web.url,
            "--sample", "0", "--json",
        )  # fmt: skip
        wait_for(lambda: _finished(nsqd, topic, "web", 10), what="every message finished")
        proc.send_signal(signal.SIGTERM)
        assert wait_exit(proc) == 143
        assert web.requests == []
    summary = json.loads(proc.stdout.read())  # type: ignore[union-attr]
    assert (summary["sampled_out"], summary["requests"], summary["delivered"]) == (10, 0, 0)


def _finished(nsqd: Any, topic: str, channel: str, count: int) -> bool:
    stats = channel_stats(nsqd.http, topic, channel) or {}
    return (
        stats.get("message_count") == count
        and stats.get("depth") == 0
        and (stats.get("in_flight_count") == 0)
    )
