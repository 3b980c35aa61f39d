"""A Spark pipeline over NSQ: publish a DataFrame, then stream it back out of a channel.

    python examples/spark_pipeline.py NSQD_TCP_ADDRESS [TOPIC]

Needs ``pip install smartnsq[spark]`` and Java 17. The ``nsq`` format is found by Spark
without a register call once smartnsq is installed.
"""

from __future__ import annotations

import os
import sys
import tempfile

from pyspark.sql import SparkSession


def main(nsqd: str, topic: str = "spark_example") -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = SparkSession.builder.master("local[2]").appName("nsq-example").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")

    # 1. Batch write. `key` would pick a partition on a partitioned (Youzan) topic; two
    #    tasks writing the same key would interleave it, so repartition by key: one task
    #    per key keeps each key's messages in order.
    orders = spark.range(1000).selectExpr(
        "concat('customer-', id % 10) AS customer",
        "to_json(named_struct('order', id, 'amount', id * 3)) AS value",
    )
    (
        orders.repartition("customer")
        .drop("customer")  # or keep it as `key` with .withColumnRenamed("customer", "key")
        .write.format("nsq")
        .mode("append")  # the default mode (error if exists) means nothing for a queue
        .option("nsqd", nsqd)
        .option("topic", topic)
        .save()
    )

    # 2. Stream the channel out, at least once: a message is FINed only after Spark has
    #    finished the micro-batch that held it. availableNow stops once the channel is idle.
    out = tempfile.mkdtemp(prefix="nsq-example-")
    query = (
        spark.readStream.format("nsq")
        .option("nsqd", nsqd)
        .option("topic", topic)
        .option("channel", "archive")
        .option("maxMessagesPerTrigger", 500)
        .load()
        .selectExpr("CAST(value AS STRING) AS json", "timestamp", "attempts")
        .writeStream.format("parquet")
        .option("path", f"{out}/data")
        .option("checkpointLocation", f"{out}/checkpoint")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    print(spark.read.parquet(f"{out}/data").count(), "messages archived to", out)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
