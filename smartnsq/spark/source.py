"""The ``nsq`` data source: where Spark finds the readers and writers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.errors import PySparkNotImplementedError
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    SimpleDataSourceStreamReader,
)
from pyspark.sql.types import StructType

from smartnsq.spark.schema import SCHEMA, check_schema, default_schema

if TYPE_CHECKING:
    from smartnsq.spark.options import Settings

# Spark imports this module in every process that looks for data sources; the readers and
# writers (and pyarrow) are imported only when a query uses them.


class NsqDataSource(DataSource):
    """NSQ as a Spark data source named ``nsq``.

    Every check runs here, on the driver, while Spark plans the query: a bad option or
    column fails the query with a :mod:`smartnsq.errors` exception before any task starts.
    """

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> str:
        # Spark asks for the schema only when reading (without a user schema): check the
        # read options here too, because an error raised while Spark creates a stream reader
        # reaches the user masked by pyspark's own clean-up.
        self._read_settings(default_schema())
        return SCHEMA

    def _read_settings(self, schema: StructType) -> Settings:
        from smartnsq.consumer import Consumer
        from smartnsq.spark.kind import check_kind
        from smartnsq.spark.options import parse

        check_schema(schema)
        settings = parse(self.options, reading=True, client=Consumer)
        # Asked of lookupd once, then kept: the instance travels pickled to the readers.
        replayable: bool | None = getattr(self, "_replayable", None)
        if replayable is None:
            replayable = check_kind(settings)
            self._replayable = replayable
        return settings

    def _replayable_read(self, schema: StructType) -> tuple[Settings, bool]:
        settings = self._read_settings(schema)
        return settings, bool(self._replayable)

    def _write_settings(self) -> Settings:
        from smartnsq.producer import Producer
        from smartnsq.spark.options import parse

        return parse(self.options, reading=False, client=Producer)

    def reader(self, schema: StructType) -> DataSourceReader:
        settings, replayable = self._replayable_read(schema)
        if replayable:
            from smartnsq.spark.youzan_reader import YouzanBatchReader

            return YouzanBatchReader(settings, schema)
        from smartnsq.spark.reader import NsqBatchReader

        return NsqBatchReader(settings, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        settings, replayable = self._replayable_read(schema)
        if not replayable:  # Spark then asks simpleStreamReader for the classic source
            raise PySparkNotImplementedError(
                errorClass="NOT_IMPLEMENTED", messageParameters={"feature": "streamReader"}
            )
        from smartnsq.spark.kind import check_stream
        from smartnsq.spark.youzan_reader import YouzanStreamReader

        check_stream(settings)
        return YouzanStreamReader(settings, schema)

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        from smartnsq.spark.reader import NsqStreamReader

        return NsqStreamReader(self._read_settings(schema), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        # Overwrite means nothing for a queue: it publishes, like append.
        from smartnsq.spark.sink import NsqWriter, check_columns

        settings = self._write_settings()
        return NsqWriter(settings, check_columns(schema, settings))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from smartnsq.spark.sink import NsqStreamWriter, check_columns

        settings = self._write_settings()
        return NsqStreamWriter(settings, check_columns(schema, settings))
