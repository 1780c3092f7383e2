"""SparkSession set-up for the pipeline: master (``--master``, ``SPARK_MASTER`` or
``local[*]``), the Python workers on this interpreter, UTC, and the ``edgekafka`` source."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from pipeline.source import EdgeKafkaDataSource

DEFAULT_MASTER = "local[*]"
DEFAULTS = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "8",
    "spark.ui.showConsoleProgress": "false",
}


def register(spark: SparkSession) -> SparkSession:
    """Make ``format("edgekafka")`` available in ``spark``."""
    spark.dataSource.register(EdgeKafkaDataSource)
    return spark


def spark_session(master: str | None = None, app_name: str = "edge-broker-pipeline",
                  config: Mapping[str, str] | None = None) -> SparkSession:
    """A session (or the running one) with the ``edgekafka`` source registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(
        master or os.environ.get("SPARK_MASTER") or DEFAULT_MASTER).appName(app_name)
    for key, value in {**DEFAULTS, **(config or {})}.items():
        builder = builder.config(key, value)
    return register(builder.getOrCreate())
