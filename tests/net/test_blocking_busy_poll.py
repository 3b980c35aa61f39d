"""The blocking connection polls for the answer to a lone request before it sleeps on it."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

import smartnsq.net.blocking as connection_module
from smartnsq.net.busy_poll import BusyPoll
from smartnsq.sync import Producer
from tests.fakes import accept_identify
from tests.helpers import topic_stats, unique


class Polls:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.budgets: list[float] = []
        self.answered: list[bool] = []  # whether the answer came while polling
        real = connection_module.poll_recv

        def poll_recv(sock: socket.socket, seconds: float) -> bytes | None:
            self.budgets.append(seconds)
            data = real(sock, seconds)
            self.answered.append(data is not None)
            return data

        monkeypatch.setattr(connection_module, "poll_recv", poll_recv)


@pytest.mark.integration
@pytest.mark.parametrize("busy_poll", [0.01, 0])
def test_each_lone_publish_polls_for_its_answer_unless_turned_off(
    classic_cluster: Any, monkeypatch: Any, busy_poll: float
) -> None:
    nsqd = classic_cluster.nsqd[0]
    topic = unique("busy")
    polls = Polls(monkeypatch)
    # A 1 s limit whenever polling is on: a loaded test machine, whose answers take longer
    # than busy_poll, would otherwise turn the polling off.
    monkeypatch.setattr(
        connection_module, "BusyPoll", lambda limit: BusyPoll(1.0 if limit else 0.0)
    )
    with Producer([nsqd.tcp], busy_poll=busy_poll) as producer:
        for i in range(20):
            producer.publish(topic, b"%d" % i)
        producer.publish_many(topic, [b"x"] * 200)
    if busy_poll:
        assert len(polls.budgets) == 21  # one poll per publish: each was alone in flight
        assert all(0.0 < b <= 1.0 for b in polls.budgets)
    else:
        assert polls.budgets == []
    assert topic_stats(nsqd.http, topic)["message_count"] == 220  # type: ignore[index]


@pytest.mark.integration
def test_a_publish_long_after_the_last_answer_does_not_poll(
    classic_cluster: Any, monkeypatch: Any
) -> None:
    nsqd = classic_cluster.nsqd[0]
    topic = unique("busy")
    polls = Polls(monkeypatch)
    monkeypatch.setattr(connection_module, "BusyPoll", lambda limit: BusyPoll(0.05))
    with Producer([nsqd.tcp], busy_poll=0.01) as producer:
        producer.publish(topic, b"1")
        producer.publish(topic, b"2")  # straight after its answer
        assert len(polls.budgets) == 2
        time.sleep(0.1)  # the caller paces itself: back later than the limit
        producer.publish(topic, b"3")
        assert len(polls.budgets) == 2
        producer.publish(topic, b"4")  # back to back again
        assert len(polls.budgets) == 3


def test_slow_answers_stop_the_polling(monkeypatch: Any) -> None:
    """An nsqd that answers after 20 ms: one poll finds nothing, then polling stops."""
    polls = Polls(monkeypatch)
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        sock, _ = server.accept()
        with sock:
            data = accept_identify(sock)
            while True:
                while data.count(b"PUB t\n") == 0 or len(data) < data.index(b"PUB t\n") + 11:
                    more = sock.recv(4096)
                    if not more:
                        return
                    data += more
                data = data[data.index(b"PUB t\n") + 11 :]  # "PUB t\n", size, 1-byte body
                time.sleep(0.02)  # a slow nsqd
                sock.sendall(b"\x00\x00\x00\x06\x00\x00\x00\x00OK")

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with Producer([f"127.0.0.1:{port}"], busy_poll=0.002, max_retries=0) as producer:
            for _ in range(3):
                producer.publish("t", b"x")
    finally:
        thread.join(10)
        server.close()
    assert polls.budgets == [0.002] and polls.answered == [False]


def test_poll_recv_returns_data_end_of_stream_or_nothing(monkeypatch: Any) -> None:
    yields: list[int] = []
    monkeypatch.setattr(connection_module, "cpu_yield", lambda: yields.append(1))
    a, b = socket.socketpair()
    with a, b:
        a.setblocking(False)
        assert connection_module.poll_recv(a, 0.0005) is None
        assert yields  # the CPU was given away between the tries
        b.sendall(b"OK")
        assert connection_module.poll_recv(a, 0.0005) == b"OK"
        b.close()
        assert connection_module.poll_recv(a, 0.0005) == b""  # the caller reports the close
