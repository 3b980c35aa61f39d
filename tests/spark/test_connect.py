"""The nsq source through Spark Connect: ``SparkSession.builder.remote("local[2]")`` starts
PySpark's local Connect server, and the client talks to it over gRPC (real nsqd, classic and
a Youzan partitioned topic).

Each test runs the client in a fresh interpreter: a process holds one Spark driver, and the
other Spark tests keep a classic session in this one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import channel_stats, create_channel, http_json, lookupds, unique
from tests.spark.test_youzan_read import PARTITIONS, new_topic

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent.parent

# argv[1]: JSON {"columns": [SQL], "write": options, "read": options, "stream": options}. The
# script writes spark.range(30) as those columns, reads once in batch, then drains with an
# availableNow stream.
SCRIPT = """
import json, os, sys
os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
from pyspark.sql import SparkSession

config = json.loads(sys.argv[1])
spark = SparkSession.builder.remote("local[2]").config("spark.ui.enabled", "false").getOrCreate()
out = {"session": type(spark).__module__}
print("session up", flush=True)

def with_options(builder, options):
    for k, v in options.items():
        builder = builder.option(k, v)
    return builder

df = spark.range(30).selectExpr(*config["columns"])
with_options(df.write.format("nsq").mode("append"), config["write"]).save()
print("written", flush=True)

def rows(found):
    return sorted([bytes(r.value).decode(), r.partition, r.offset] for r in found)

out["read"] = rows(with_options(spark.read.format("nsq"), config["read"]).load().collect())
stream = with_options(spark.readStream.format("nsq"), config["stream"]).load()
query = (stream.writeStream.format("memory").queryName("rest")
         .trigger(availableNow=True).start())
query.awaitTermination(180)
out["stream_error"] = None if query.exception() is None else str(query.exception())[:2000]
out["stream"] = rows(spark.sql("SELECT * FROM rest").collect())
print("RESULT " + json.dumps(out))
spark.stop()
"""


def through_connect(config: dict[str, Any]) -> dict[str, Any]:
    """Run SCRIPT with this config; what it printed after ``RESULT``."""
    config = {"columns": ["CAST(id AS STRING) AS value"], **config}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=840,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    # Java stack frames say nothing the test needs and would hide the Python error.
    errors = "\n".join(x for x in done.stderr.splitlines() if not x.startswith("\tat "))
    assert done.returncode == 0 and lines, errors[-8000:]
    out: dict[str, Any] = json.loads(lines[0][len("RESULT ") :])
    assert out["session"] == "pyspark.sql.connect.session"  # really through Connect
    assert out["stream_error"] is None
    return out


def values(rows: list[list[Any]]) -> list[str]:
    return sorted((r[0] for r in rows), key=int)


@pytest.mark.timeout(900)  # a second Spark driver, started by the Connect client
def test_write_batch_read_and_available_now_stream_through_spark_connect(
    classic_cluster: Any,
) -> None:
    nsqd = classic_cluster.nsqd[0]
    topic, channel = unique("spark_c"), "connect"
    create_channel(nsqd.http, topic, channel)
    where = {"nsqd": nsqd.tcp, "topic": topic}
    read = {**where, "channel": channel}
    out = through_connect({"write": where, "read": {**read, "maxMessages": 10}, "stream": read})
    assert len(out["read"]) == 10  # a classic read consumes: the stream gets the other 20
    assert values(out["read"] + out["stream"]) == [str(i) for i in range(30)]
    stats = channel_stats(nsqd.http, topic, channel)
    assert stats is not None and stats["depth"] == 0 and stats["in_flight_count"] == 0


@pytest.mark.timeout(900)
def test_youzan_partitioned_topic_through_spark_connect(youzan_cluster: Any) -> None:
    """Write, read by offsets and stream a Youzan partitioned topic through Connect: the
    ranges are planned and read on the server side just as in a classic session."""
    topic, leaders = new_topic(youzan_cluster, "spark_cy")
    where = {"lookupd": lookupds(youzan_cluster)[0], "topic": topic}
    out = through_connect(
        {
            "columns": [
                "CAST(id AS STRING) AS value",
                f"CAST(id % {PARTITIONS} AS INT) AS partition",
            ],
            "write": where,
            "read": where,  # earliest to latest, consumes nothing
            "stream": {**where, "startingOffsets": "earliest", "maxOffsetsPerTrigger": 12},
        }
    )
    everything = [str(i) for i in range(30)]
    # A range read consumes nothing: the batch read and the stream each see every row once.
    assert values(out["read"]) == everything and values(out["stream"]) == everything
    assert sorted(out["read"]) == sorted(out["stream"])  # the same (partition, offset) each
    assert len({(r[1], r[2]) for r in out["read"]}) == 30
    assert all(int(r[0]) % PARTITIONS == r[1] for r in out["read"])  # the partition column
    # Nothing was consumed from the topic's own channel, and the reads' channels are gone.
    depths = []
    for p, http in leaders.items():
        stats = http_json(f"http://{http}/stats?format=json&topic={topic}&partition={p}")
        for t in stats["topics"]:
            if t["topic_partition"] == str(p):
                assert [c["channel_name"] for c in t["channels"]] == ["ch"]
                depths.append(t["channels"][0]["depth"])
    assert len(depths) == PARTITIONS and sum(depths) == 30
