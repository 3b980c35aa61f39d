"""One real Spark session (local[2]) for the Spark tests; pyspark is imported only here."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.fail(
            "Java is missing: Spark needs Java 17 (`./dev setup` installs Debian's "
            "openjdk-17-jre-headless as root; else `sudo apt-get install openjdk-17-jre-headless`)"
        )
    # Workers must run this interpreter (it has smartnsq and pyarrow), on loopback.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("smartnsq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
