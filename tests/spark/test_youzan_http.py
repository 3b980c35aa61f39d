"""The source's HTTP side: no trust store for plain http, and time look-ups against a fake
nsqd whose channels move late (no Spark, no servers but loopback fakes)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import smartnsq.net.http
from smartnsq.spark import youzan
from tests.helpers import HttpRequest, blocking_fake_api


class NoTrustStore(Exception):
    """Raised where the trust store would be loaded."""


def test_plain_http_never_loads_the_trust_store(monkeypatch: pytest.MonkeyPatch) -> None:
    # Loading it took 110 ms of a query's start, for nsqd endpoints that are never https.
    asked: list[bool] = []

    def verify() -> Any:
        asked.append(True)
        raise NoTrustStore

    monkeypatch.setattr(smartnsq.net.http, "tls_verify", verify)
    with LateNsqd(400, 0).serving() as nsqd:
        info = nsqd.partition()
        assert youzan.offsets_at_time([info], 1_700_000_000, "spark") == {0: 400}
        assert youzan.open_channel(info, "task", 0) == 0
        assert youzan.topic_layout((f"http://{info.http}",), "t") is None  # a 404
        assert not asked
        with pytest.raises(NoTrustStore):  # where an https URL loads it
            youzan.topic_layout((f"https://{info.http}",), "t")
        assert asked == [True]


class LateNsqd:
    """An nsqd whose channels take a new position only after a few more /stats reads, as the
    fork's do (in the channel's goroutine, after /channel/setoffset has answered)."""

    END, COUNT = 1000, 10

    def __init__(self, at_time: int, lag: int, step: int = 1) -> None:
        self.at_time, self.lag = at_time, lag
        self.step = step  # messages start at multiples of step
        self.position: dict[str, int] = {}
        self.pending: dict[str, list[int]] = {}  # channel -> [target, reads left]
        self.address = ""  # host:port of its HTTP API, while serving

    def handle(self, request: HttpRequest) -> tuple[int, bytes]:
        channel = request.query.get("channel", "")
        path = request.path
        if path == "/channel/create":
            self.position[channel] = self.END  # a new channel starts at the end
        elif path == "/channel/delete":
            self.position.pop(channel, None)
        elif path == "/channel/setoffset":
            kind, _, value = request.body.decode().partition(":")
            # virtual_queue: the first message at or after the offset
            target = (
                -(-int(value) // self.step) * self.step if kind == "virtual_queue" else self.at_time
            )
            self.pending[channel] = [target, self.lag]
        elif path == "/stats":
            late = self.pending.get(channel)
            if late is not None:
                late[1] -= 1
                if late[1] < 0:
                    self.position[channel] = self.pending.pop(channel)[0]
            channels = [
                {
                    "channel_name": channel,
                    "message_count": self.COUNT,
                    "depth": 0,
                    "depth_size": self.END - self.position[channel],
                }
            ]
            return 200, json.dumps({"topics": [{
                "topic_name": "t", "topic_partition": "0", "is_leader": True,
                "backend_start": 0, "backend_depth": self.END, "message_count": self.COUNT,
                "channels": channels,
            }]}).encode()  # fmt: skip
        else:
            return 404, b'{"message":"NOT_FOUND"}'
        return 200, b""

    @contextmanager
    def serving(self) -> Iterator[LateNsqd]:
        """This nsqd's HTTP API on loopback, in a thread (the source's calls block)."""
        with blocking_fake_api(self.handle) as address:
            self.address = address
            yield self

    def partition(self) -> youzan.PartitionInfo:
        """Partition 0 of topic t, led by this nsqd."""
        return youzan.PartitionInfo("t", 0, "n:4150", self.address, 0, 1000, 10, False, False)


@pytest.mark.parametrize("answer", [0, 400, 1000])
@pytest.mark.parametrize("lag", [0, 3])
def test_a_time_is_read_once_the_channels_have_moved(answer: int, lag: int) -> None:
    with LateNsqd(answer, lag).serving() as nsqd:
        assert youzan.offsets_at_time([nsqd.partition()], 1_700_000_000, "spark") == {0: answer}
    assert nsqd.position == {}  # the probes are gone


@pytest.mark.parametrize("lag", [0, 3])
@pytest.mark.parametrize(("start", "position"), [(0, 0), (400, 400), (450, 500), (950, 1000)])
def test_a_task_channel_is_read_from_once_it_has_moved(lag: int, start: int, position: int) -> None:
    """A task reads its range only from where its channel has moved (a message from where a
    new channel starts, the end, would end the range early), and learns when no message
    starts in the range (950: the last message starts at 900), even though that channel
    stays where it started."""
    with LateNsqd(0, lag, step=100).serving() as nsqd:
        assert youzan.open_channel(nsqd.partition(), "task", start) == position
    assert nsqd.position == {"task": position} and not nsqd.pending
