"""SparkSession set-up for the pipeline: master (``--master``, ``SPARK_MASTER`` or
``local[*]``), the Python workers on this interpreter, UTC, the ``edgekafka`` source, and a
line per finished stage on stderr."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark import SparkContext
from pyspark.sql import SparkSession

from pipeline.progress import report_stages
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
                  config: Mapping[str, str] | None = None,
                  progress: bool = True) -> SparkSession:
    """A session (or the running one) with the ``edgekafka`` source registered; with
    ``progress``, a line on stderr when Spark starts and one per finished stage
    (:mod:`pipeline.progress`)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    chosen = master or os.environ.get("SPARK_MASTER") or DEFAULT_MASTER
    builder = SparkSession.builder.master(chosen).appName(app_name)
    for key, value in {**DEFAULTS, **(config or {})}.items():
        builder = builder.config(key, value)
    if progress and SparkContext._active_spark_context is None:
        print(f"spark: starting Spark on {chosen} (its first start takes a while)",
              file=sys.stderr, flush=True)
    spark = register(builder.getOrCreate())
    if progress:
        report_stages(spark.sparkContext)
    return spark
