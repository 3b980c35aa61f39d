"""The source's HTTP side: kept clients, and time look-ups against a fake nsqd whose
channels move late (no Spark, no servers)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import respx

from smartnsq.spark import youzan


def test_plain_http_never_loads_the_trust_store(monkeypatch: pytest.MonkeyPatch) -> None:
    # Loading it took 110 ms of a query's start, for nsqd endpoints that are never https.
    monkeypatch.setattr(youzan, "_clients", {})
    asked: list[bool] = []

    def verify() -> Any:
        asked.append(True)
        return True

    monkeypatch.setattr(youzan, "tls_verify", verify)
    plain = youzan._client("http://127.0.0.1:4151/stats")
    assert youzan._client("http://127.0.0.1:4161/lookup") is plain and not asked
    secure = youzan._client("https://lookupd:4161/lookup")
    assert secure is not plain and asked == [True]
    assert youzan._client("https://other:4161/lookup") is secure and asked == [True]


class LateNsqd:
    """An nsqd whose channels take a new position only after a few more /stats reads, as the
    fork's do (in the channel's goroutine, after /channel/setoffset has answered)."""

    END, COUNT = 1000, 10

    def __init__(self, at_time: int, lag: int, step: int = 1) -> None:
        self.at_time, self.lag = at_time, lag
        self.step = step  # messages start at multiples of step
        self.position: dict[str, int] = {}
        self.pending: dict[str, list[int]] = {}  # channel -> [target, reads left]

    def handle(self, request: httpx.Request) -> httpx.Response:
        channel = request.url.params.get("channel", "")
        path = request.url.path
        if path == "/channel/create":
            self.position[channel] = self.END  # a new channel starts at the end
        elif path == "/channel/delete":
            self.position.pop(channel, None)
        elif path == "/channel/setoffset":
            kind, _, value = request.content.decode().partition(":")
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
            return httpx.Response(200, json={"topics": [{
                "topic_name": "t", "topic_partition": "0", "is_leader": True,
                "backend_start": 0, "backend_depth": self.END, "message_count": self.COUNT,
                "channels": channels,
            }]})  # fmt: skip
        return httpx.Response(200)


@pytest.mark.parametrize("answer", [0, 400, 1000])
@pytest.mark.parametrize("lag", [0, 3])
def test_a_time_is_read_once_the_channels_have_moved(
    monkeypatch: pytest.MonkeyPatch, answer: int, lag: int
) -> None:
    monkeypatch.setattr(youzan, "_clients", {})
    nsqd = LateNsqd(answer, lag)
    info = youzan.PartitionInfo("t", 0, "n:4150", "n:4151", 0, 1000, 10, False, False)
    with respx.mock(assert_all_mocked=True) as mock:
        mock.route(host="n").mock(side_effect=nsqd.handle)
        assert youzan.offsets_at_time([info], 1_700_000_000, "spark") == {0: answer}
    assert nsqd.position == {}  # the probes are gone


@pytest.mark.parametrize("lag", [0, 3])
@pytest.mark.parametrize(("start", "position"), [(0, 0), (400, 400), (450, 500), (950, 1000)])
def test_a_task_channel_is_read_from_once_it_has_moved(
    monkeypatch: pytest.MonkeyPatch, lag: int, start: int, position: int
) -> None:
    """A task reads its range only from where its channel has moved (a message from where a
    new channel starts, the end, would end the range early), and learns when no message
    starts in the range (950: the last message starts at 900), even though that channel
    stays where it started."""
    monkeypatch.setattr(youzan, "_clients", {})
    nsqd = LateNsqd(0, lag, step=100)
    info = youzan.PartitionInfo("t", 0, "n:4150", "n:4151", 0, 1000, 10, False, False)
    with respx.mock(assert_all_mocked=True) as mock:
        mock.route(host="n").mock(side_effect=nsqd.handle)
        assert youzan.open_channel(info, "task", start) == position
    assert nsqd.position == {"task": position} and not nsqd.pending
