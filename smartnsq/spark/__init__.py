"""NSQ as an Apache Spark data source (``pip install smartnsq[spark]``).

After installation Spark finds the source by itself (``format("nsq")``). If smartnsq was
installed after the Spark session started, register it::

    from smartnsq.spark import NsqDataSource
    spark.dataSource.register(NsqDataSource)

Importing :mod:`smartnsq` does not import this package or pyspark.
"""

from smartnsq.spark.source import NsqDataSource

__all__ = ["NsqDataSource"]
