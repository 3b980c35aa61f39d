"""The nsq source through Spark Connect: ``SparkSession.builder.remote("local[2]")`` starts
PySpark's local Connect server, and the client talks to it over gRPC (real nsqd).

It runs in a fresh interpreter: a process holds one Spark driver, and the other Spark tests
keep a classic session in this one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import channel_stats, create_channel, unique

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent.parent

SCRIPT = """
import json, os, sys
os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
from pyspark.sql import SparkSession

nsqd, topic, channel = sys.argv[1:4]
spark = SparkSession.builder.remote("local[2]").config("spark.ui.enabled", "false").getOrCreate()
out = {"session": type(spark).__module__}
print("session up", flush=True)
df = spark.range(30).selectExpr("CAST(id AS STRING) AS value")
df.write.format("nsq").mode("append").option("nsqd", nsqd).option("topic", topic).save()

def read():
    return (spark.read.format("nsq").option("nsqd", nsqd).option("topic", topic)
            .option("channel", channel).option("maxMessages", 10).load())

print("written", flush=True)
out["read"] = sorted(bytes(r.value).decode() for r in read().collect())
stream = (spark.readStream.format("nsq").option("nsqd", nsqd).option("topic", topic)
          .option("channel", channel).load())
query = (stream.select("value").writeStream.format("memory").queryName("rest")
         .trigger(availableNow=True).start())
query.awaitTermination(180)
out["stream_error"] = None if query.exception() is None else str(query.exception())[:2000]
rest = spark.sql("SELECT value FROM rest").collect()
out["stream"] = sorted(bytes(r.value).decode() for r in rest)
print("RESULT " + json.dumps(out))
spark.stop()
"""


@pytest.mark.timeout(900)  # a second Spark driver, started by the Connect client
def test_write_batch_read_and_available_now_stream_through_spark_connect(
    classic_cluster: Any,
) -> None:
    nsqd = classic_cluster.nsqd[0]
    topic, channel = unique("spark_c"), "connect"
    create_channel(nsqd.http, topic, channel)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, nsqd.tcp, topic, channel],
        capture_output=True,
        text=True,
        timeout=840,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-5000:]
    out = json.loads(lines[0][len("RESULT ") :])
    assert out["session"] == "pyspark.sql.connect.session"  # really through Connect
    assert len(out["read"]) == 10
    assert out["stream_error"] is None
    assert sorted(out["read"] + out["stream"], key=int) == [str(i) for i in range(30)]
    stats = channel_stats(nsqd.http, topic, channel)
    assert stats is not None and stats["depth"] == 0 and stats["in_flight_count"] == 0
