"""The audit event, as the broker writes it (one JSON object per record), as Spark columns.

``{"kind": "authentication"|"authorization"|"connection", "outcome": "success"|"failure"|
"denied"|"rejected", "listener", "client", "principal", "tenant", "mechanism", "api",
"resource", "reason", "time", "count"}`` with ``time`` in epoch milliseconds and ``count``
the events one record stands for (a summary of those the broker's bounds left out counts
them all; records written before the field existed stand for 1). :func:`parse_events`
adds ``event_time`` (a timestamp), ``source`` (the client's host, without its port), and
the counts of login successes, login failures, denials and rejected connections each
record stands for (``count`` or 0): sum them, never count rows.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from common.names import DEFAULT_AUDIT_TOPIC

AUDIT_TOPIC = DEFAULT_AUDIT_TOPIC
"""The audit topic the jobs read unless told another (the broker's default home)."""
UNKNOWN = "-"

EVENT_SCHEMA = StructType(
    [StructField(name, StringType(), True) for name in (
        "kind", "outcome", "listener", "client", "principal", "tenant", "mechanism", "api",
        "resource", "reason")]
    + [StructField("time", LongType(), True), StructField("count", LongType(), True)])


def source_host(kind: Column, client: Column) -> Column:
    """The client's host: authorization events carry the host alone; the others carry
    ``host:port`` (IPv6 hosts unbracketed, so only a trailing ``:digits`` is the port)."""
    return F.when(kind == "authorization", client).otherwise(
        F.regexp_replace(client, r":[0-9]+$", ""))


def _counted(condition: Column) -> Column:
    """The events the record stands for when ``condition`` holds, else 0."""
    return F.when(condition, F.col("count")).otherwise(0)


def parse_events(raw: DataFrame) -> DataFrame:
    """Rows of the ``edgekafka`` source to one row per audit event (unparseable ones
    dropped)."""
    parsed = raw.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"),
                        F.col("timestamp").alias("record_time"))
    events = (parsed.where(F.col("e.kind").isNotNull()).select("e.*", "record_time")
              .withColumn("count", F.coalesce(F.col("count"), F.lit(1))))
    kind, outcome = F.col("kind"), F.col("outcome")
    return events.select(
        "*",
        F.coalesce(F.timestamp_millis(F.col("time")), F.col("record_time")).alias("event_time"),
        F.coalesce(source_host(kind, F.col("client")), F.lit(UNKNOWN)).alias("source"),
        F.coalesce(F.col("tenant"), F.lit(UNKNOWN)).alias("tenant_name"),
        F.coalesce(F.col("principal"), F.lit(UNKNOWN)).alias("principal_name"),
        _counted((kind == "authentication") & (outcome == "success")).alias("login_ok"),
        _counted((kind == "authentication") & (outcome == "failure")).alias("login_failed"),
        _counted(outcome == "denied").alias("denied"),
        _counted((kind == "connection") & (outcome == "rejected")).alias("rejected"),
    )
