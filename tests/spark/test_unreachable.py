"""A classic read from addresses that do not answer fails with a clear error; it never
returns no rows as if the channel were empty (real Spark, real nsqd)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from smartnsq.errors import NoNsqdAvailable
from smartnsq.spark.options import Settings
from smartnsq.spark.reader import DrainPartition, NsqBatchReader, NsqStreamReader
from smartnsq.spark.schema import default_schema
from tests.helpers import create_channel, unique
from tests.spark.test_read import publish

pytestmark = pytest.mark.integration


def closed_port() -> str:
    """A loopback address where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def failure(action: Any) -> str:
    with pytest.raises(Exception) as info:
        action()
    return str(info.value)


def test_batch_read_and_available_now_from_an_unreachable_nsqd_fail(spark: Any) -> None:
    dead = closed_port()

    def reader(**options: str) -> Any:
        r = spark.read.format("nsq").option("topic", "t").option("channel", "c")
        for k, v in options.items():
            r = r.option(k, v)
        return r

    text = failure(lambda: reader(nsqd=dead).load().collect())
    assert "NoNsqdAvailable" in text and "can be reached" in text and dead in text
    # a user-given schema: Spark asks no schema() of the source, the planning check holds
    text = failure(lambda: reader(nsqd=dead).schema("value binary").load().collect())
    assert "NoNsqdAvailable" in text and dead in text

    stream = (
        spark.readStream.format("nsq")
        .option("nsqd", dead)
        .option("topic", "t")
        .option("channel", "c")
    )

    def run_available_now() -> None:
        query = stream.load().writeStream.format("noop").trigger(availableNow=True).start()
        query.awaitTermination(120)
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))

    text = failure(run_available_now)
    assert "NoNsqdAvailable" in text and dead in text

    # a write fails too: every row must be acknowledged
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    writer = df.write.format("nsq").mode("append").option("nsqd", dead).option("topic", "t")
    text = failure(writer.save)
    assert dead in text


def test_read_through_an_unreachable_lookupd_fails(spark: Any) -> None:
    dead = closed_port()
    for kind in ("auto", "classic"):
        r = spark.read.format("nsq").option("lookupd", dead).option("topic", "t")
        r = r.option("channel", "c").option("clusterKind", kind)
        text = failure(lambda r=r: r.load().collect())
        assert "LookupFailed" in text and "option 'lookupd'" in text and dead in text, kind


def test_one_unreachable_nsqd_among_others_is_skipped(spark: Any, classic_cluster: Any) -> None:
    nsqd = classic_cluster.nsqd[0]
    topic, channel = unique("spark_u"), "c"
    create_channel(nsqd.http, topic, channel)
    publish(nsqd.tcp, topic, [b"u-%d" % i for i in range(20)])
    rows = (
        spark.read.format("nsq")
        .option("nsqd", f"{closed_port()},{nsqd.tcp}")
        .option("topic", topic)
        .option("channel", channel)
        .option("idleTimeoutMs", 3000)
        .load()
        .collect()
    )
    assert sorted(bytes(r.value) for r in rows) == sorted(b"u-%d" % i for i in range(20))


def test_readers_that_cannot_connect_where_they_run_fail() -> None:
    # The driver reached nsqd while planning; the process that reads does not.
    settings = Settings(
        nsqd=(closed_port(),), topic="t", channel="c", idle_timeout=0.5, poll_timeout=0.1
    )
    batch = NsqBatchReader(settings, default_schema())
    with pytest.raises(NoNsqdAvailable, match="no connection to any nsqd"):
        list(batch.read(DrainPartition(10)))
    stream = NsqStreamReader(settings, default_schema())
    stream.prepareForTriggerAvailableNow()
    try:
        with pytest.raises(NoNsqdAvailable, match="no connection to any nsqd"):
            stream.read(stream.initialOffset())
    finally:
        stream.stop()
