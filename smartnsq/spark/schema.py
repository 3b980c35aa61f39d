"""The rows the ``nsq`` source reads: :data:`SCHEMA`, and the check of a user-given schema.

Imported by :mod:`~smartnsq.spark.source` in every process where Spark looks for data
sources, so it stays small (pyspark's types only).
"""

from __future__ import annotations

from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from smartnsq.errors import InvalidArgument

SCHEMA = (
    "value binary, topic string, partition int, offset long, timestamp timestamp, "
    "attempts int, id string, trace_id long, headers map<string,string>, nsqd string"
)


def default_schema() -> StructType:
    """The source's row schema (:data:`SCHEMA`) as a StructType; needs no Spark session."""
    text = StringType()
    return StructType(
        [
            StructField("value", BinaryType()),
            StructField("topic", text),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("timestamp", TimestampType()),
            StructField("attempts", IntegerType()),
            StructField("id", text),
            StructField("trace_id", LongType()),
            StructField("headers", MapType(text, text)),
            StructField("nsqd", text),
        ]
    )


def check_schema(schema: StructType) -> None:
    """A user-given schema must be a selection of the source's columns, with their types."""
    ours = {f.name: f.dataType for f in default_schema().fields}
    for f in schema.fields:
        if f.name not in ours:
            raise InvalidArgument(
                f"the nsq source has no column {f.name!r}; its columns are: {SCHEMA}"
            )
        if f.dataType != ours[f.name]:
            raise InvalidArgument(
                f"column {f.name!r} of the nsq source is {ours[f.name].simpleString()}, not "
                f"{f.dataType.simpleString()}: fix the schema or cast after loading"
            )
