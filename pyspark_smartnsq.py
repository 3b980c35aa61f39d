"""Lets Spark find the ``nsq`` data source by itself.

Spark 4 imports every top-level module named ``pyspark_*`` and registers its
``DefaultSource``. See :mod:`smartnsq.spark`.
"""

from smartnsq.spark.source import NsqDataSource as DefaultSource

__all__ = ["DefaultSource"]
