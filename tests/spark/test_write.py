"""df.write / df.writeStream to real nsqd through the nsq data source."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.helpers import drain, topic_stats, unique, wait_for

pytestmark = pytest.mark.integration


def test_batch_write_publishes_every_row_once(spark: Any, classic_cluster: Any) -> None:
    nsqd = classic_cluster.nsqd[0]
    topic = unique("spark_w")
    n = 100_000
    df = spark.range(n, numPartitions=4).selectExpr("CAST(concat('m-', id) AS BINARY) AS value")
    df.write.format("nsq").mode("append").option("nsqd", nsqd.tcp).option("topic", topic).save()

    stats = topic_stats(nsqd.http, topic)
    assert stats is not None and stats["message_count"] == n
    got = anyio.run(drain, nsqd.tcp, topic, "check", n)
    bodies = sorted(m.body for m in got)
    assert bodies == sorted(b"m-%d" % i for i in range(n))
