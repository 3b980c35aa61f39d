"""Misuse fails the query while Spark plans it, with a smartnsq error that says what to change."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import topic_stats, unique

pytestmark = pytest.mark.integration


def failure(action: Any) -> str:
    with pytest.raises(Exception) as info:
        action()
    return str(info.value)


def test_bad_write_options_and_columns(spark: Any, classic_cluster: Any) -> None:
    nsqd = classic_cluster.nsqd[0]
    topic = unique("spark_bad")
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")

    def save(frame: Any = df, **options: Any) -> Any:
        writer = frame.write.format("nsq").mode("append")
        for k, v in options.items():
            writer = writer.option(k, v)
        return lambda: writer.save()

    good = {"nsqd": nsqd.tcp, "topic": topic}
    text = failure(save(**good, topci="x"))
    assert "InvalidArgument" in text and "unknown option 'topci'" in text
    text = failure(save(nsqd=nsqd.tcp))
    assert "set option 'topic', or give the DataFrame a 'topic' column" in text
    text = failure(save(topic=topic))
    assert "set option 'lookupd'" in text
    text = failure(save(nsqd="127.0.0.1:notaport", topic=topic))
    assert "option 'nsqd'" in text and "non-numeric port" in text
    text = failure(save(**good, **{"nsq.max_retries": "many"}))
    assert "option 'nsq.max_retries' must be a whole number, not 'many'" in text
    text = failure(save(**good, **{"nsq.max_in_flight": "5"}))
    assert "unknown option 'nsq.max_in_flight'" in text and "Producer" in text
    text = failure(save(**good, channel="c"))
    assert "option 'channel' applies only to reading" in text
    text = failure(save(spark.range(3).selectExpr("id AS value"), **good))
    assert "InvalidType" in text and "column 'value' must be binary or string, not bigint" in text
    text = failure(save(df.selectExpr("value", "1 AS extra"), **good))
    assert "unknown column(s) 'extra'" in text and "ignoreExtraColumns=true" in text
    # Nothing reached nsqd: every mistake was caught before a task ran.
    assert topic_stats(nsqd.http, topic) is None


def test_bad_read_options(spark: Any, classic_cluster: Any) -> None:
    nsqd = classic_cluster.nsqd[0]
    reader = spark.readStream.format("nsq").option("nsqd", nsqd.tcp).option("channel", "c")
    text = failure(lambda: reader.load())
    assert "set option 'topic': the topic to read" in text
    text = failure(lambda: reader.option("topic", "t").option("maxMessagesPerTrigger", 0).load())
    assert "option 'maxMessagesPerTrigger' must be >= 1, not 0" in text
    text = failure(lambda: reader.option("topic", "bad topic!").load())
    assert "option 'topic'" in text and "may contain only letters" in text
    text = failure(lambda: reader.option("topic", "t").option("nsq.tls", "maybe").load())
    assert "option 'nsq.tls' must be true or false, not 'maybe'" in text
    text = failure(
        lambda: spark.read.format("nsq").option("nsqd", nsqd.tcp).option("topic", "t").load()
    )
    assert "set option 'channel'" in text
