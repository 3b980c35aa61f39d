"""The campaign's runner on real servers: a calm seed passes (classic and fork), a lost
message is caught, and the fork's channel counts mean what classic nsqd's mean."""

from __future__ import annotations

import threading

import pytest

import smartnsq.sync
from compat.pytest_plugin import require_youzan_binaries
from compat.youzan import create_topic
from smartnsq import Message
from tests.faults.campaign import doors
from tests.faults.campaign.run import _channel_counts, run_seed, wait_until
from tests.faults.campaign.schedule import Flow, Schedule

pytestmark = [pytest.mark.integration, pytest.mark.faults]

CALM = Schedule(
    seed=-1,
    kind="classic",
    seconds=8.0,
    nsqd=2,
    lookupd=1,
    flows=(
        Flow(0, "async-producer", "async-consumer", rate=50),
        Flow(1, "pub", "to-file", rate=50),
    ),
)


def test_a_calm_seed_has_no_violation(tmp_path):
    result = run_seed(CALM, tmp_path)
    assert result.violations == []
    assert [f.acked for f in result.flows] == [f.handled for f in result.flows]
    assert all(f.acked > 100 for f in result.flows), result.flows
    assert result.logs is None  # a passing seed's logs are removed


@pytest.mark.slow  # the runner waits its whole settling time for the missing message
def test_a_message_finished_but_never_handled_is_reported_lost(tmp_path, monkeypatch):
    handle = doors.Book.handle

    def forgetful(book: doors.Book, body: bytes) -> None:
        if body != b"f0:a1:3":  # handled (FIN), never booked: as if the handler lost it
            handle(book, body)

    monkeypatch.setattr(doors.Book, "handle", forgetful)
    result = run_seed(CALM, tmp_path)
    assert len(result.violations) == 1, result.violations
    assert result.violations[0].startswith("lost: flow0 (async-producer -> async-consumer): 1 of ")
    assert "f0:a1:3" in result.violations[0]
    assert result.logs is not None and (result.logs / "timeline.txt").exists()


CALM_FORK = Schedule(
    seed=-1,
    kind="youzan",
    seconds=8.0,
    nsqd=3,
    lookupd=1,
    flows=(
        Flow(0, "pub", "to-nsq", rate=50),  # an unordered topic, its copy on another
        Flow(1, "blocking-producer", "ordered-consumer", rate=50),
    ),
)


def test_a_calm_seed_on_the_fork_has_no_violation(tmp_path):
    require_youzan_binaries()
    result = run_seed(CALM_FORK, tmp_path)
    assert result.violations == []
    assert [f.acked for f in result.flows] == [f.handled for f in result.flows]
    assert all(f.acked > 100 for f in result.flows), result.flows


def test_the_fork_s_channel_counts_keep_in_flight_out_of_depth_and_deferred_out_of_in_flight(
    youzan_cluster,
):
    """The fork's channel depth counts what is in flight, and its in-flight count what is
    deferred; the campaign counts them apart, as classic nsqd does (else a deferred message
    reads as in flight after a graceful stop)."""
    topic = "campaign-counts"
    create_topic(youzan_cluster, topic, partitions=1, replicas=1, channel=doors.CHANNEL)
    lookupd = [d.http for d in youzan_cluster.lookupd]
    nsqd_http = [d.http for d in youzan_cluster.nsqd]
    with smartnsq.sync.Producer(lookupd_http_addresses=lookupd) as producer:
        for n in range(6):
            producer.publish(topic, b"m%d" % n)
    release = threading.Event()

    def handle(message: Message) -> None:
        if message.body == b"m0":
            raise RuntimeError("deferred for a minute")
        if message.body == b"m1":
            release.wait(60)  # held in flight

    consumer = smartnsq.sync.Consumer(
        topic, doors.CHANNEL, handle, lookupd_http_addresses=lookupd, max_in_flight=1,
        requeue_delay=60.0, max_backoff_duration=0.1, backoff_unit=0.01,
    )  # fmt: skip
    consumer.start()
    try:
        want = {"depth": 4, "in_flight": 1, "deferred": 1}
        assert wait_until(lambda: _channel_counts(nsqd_http, topic, doors.CHANNEL) == want, 30), (
            _channel_counts(nsqd_http, topic, doors.CHANNEL)
        )
    finally:
        release.set()
        consumer.close()
    after = _channel_counts(nsqd_http, topic, doors.CHANNEL)
    assert (after["in_flight"], after["deferred"]) == (0, 1), after
