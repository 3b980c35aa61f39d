"""The classic source's Feed on a real nsqd: messages taken by Spark stay in flight, touched,
until they are answered."""

from __future__ import annotations

import time
from typing import Any

import pytest

from smartnsq import Consumer
from smartnsq.spark.feed import Feed
from smartnsq.spark.options import parse
from tests.helpers import channel_stats, create_channel, unique, wait_for
from tests.spark.test_read import publish

pytestmark = pytest.mark.integration


def test_taken_batches_are_touched_until_finished(classic_cluster: Any) -> None:
    nsqd = classic_cluster.nsqd[0]
    topic, channel = unique("spark_feed"), "spark"
    create_channel(nsqd.http, topic, channel)
    publish(nsqd.tcp, topic, [b"f-%d" % i for i in range(40)])
    options = {
        "nsqd": nsqd.tcp,
        "topic": topic,
        "channel": channel,
        "nsq.msg_timeout": "1",  # nsqd's shortest; touched every 0.2 s
        "touchIntervalMs": "200",
    }
    feed = Feed(parse(options, reading=True, client=Consumer), 40)
    try:
        first = feed.take(20, 5.0, 1.0)
        second = feed.take(20, 5.0, 1.0)
        assert len(first) == len(second) == 20
        # Held for seven message timeouts (nsqd scans a new channel for timeouts only after
        # its 5 s refresh): without the touches, nsqd would time every one of them out.
        time.sleep(7.0)
        stats = channel_stats(nsqd.http, topic, channel)
        assert stats is not None
        assert stats["timeout_count"] == 0
        assert stats["in_flight_count"] == 40
        feed.finish([first])
        # The other batch is still held, so still touched, after the first is answered.
        time.sleep(2.5)
        stats = wait_for(
            lambda: (
                (s := channel_stats(nsqd.http, topic, channel)) and s["in_flight_count"] == 20 and s
            ),
            what="the first batch finished",
        )
        assert stats["timeout_count"] == 0
        feed.finish([second])
        wait_for(
            lambda: (s := channel_stats(nsqd.http, topic, channel)) and s["in_flight_count"] == 0,
            what="the second batch finished",
        )
    finally:
        feed.close()
    stats = channel_stats(nsqd.http, topic, channel)
    assert stats is not None
    assert (stats["depth"], stats["requeue_count"], stats["timeout_count"]) == (0, 0, 0)


def test_close_gives_back_held_and_buffered_messages_at_once(classic_cluster: Any) -> None:
    nsqd = classic_cluster.nsqd[0]
    topic, channel = unique("spark_feed"), "spark"
    create_channel(nsqd.http, topic, channel)
    publish(nsqd.tcp, topic, [b"g-%d" % i for i in range(30)])
    options = {"nsqd": nsqd.tcp, "topic": topic, "channel": channel}
    feed = Feed(parse(options, reading=True, client=Consumer), 30)
    held = feed.take(10, 5.0, 1.0)
    assert len(held) == 10
    # the other 20 arrive in the buffer (nsqd has them all in flight to us)
    wait_for(
        lambda: (s := channel_stats(nsqd.http, topic, channel)) and s["in_flight_count"] == 30,
        what="every message sent to the feed",
    )
    feed.close()
    # requeued, not left to time out (the default message timeout is a minute)
    stats = wait_for(
        lambda: (
            (s := channel_stats(nsqd.http, topic, channel))
            and s["depth"] == 30
            and s["in_flight_count"] == 0
            and s
        ),
        what="all 30 back in the channel",
    )
    assert (stats["requeue_count"], stats["timeout_count"]) == (30, 0)
