"""The streaming audit job: burst alerts published to ``__audit_alerts`` as they happen.

Failed logins are counted per source in sliding windows (length ``window_seconds``,
sliding by half of it) with a watermark of one window; every micro-batch publishes the
windows that reached ``threshold`` or grew since, one JSON record each, keyed
``source@window start`` (a later record for the same key carries a higher count):
``{"alert": "password-guessing", "source", "failures", "threshold", "window_start",
"window_end", "listeners", "last_failure"}`` (times in epoch ms). The alerts topic is
created when missing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import NewTopic
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from pipeline import clients
from pipeline.audit.analysis import BurstRule
from pipeline.audit.events import AUDIT_TOPIC, parse_events
from pipeline.options import parse_options
from pipeline.source import SHORT_NAME

log = logging.getLogger(__name__)
ALERTS_TOPIC = "__audit_alerts"


@dataclass(frozen=True)
class AlertSettings:
    """What to watch, where to publish, and where to keep the checkpoint."""

    bootstrap: str
    checkpoint: Path
    topic: str = AUDIT_TOPIC
    alerts_topic: str = ALERTS_TOPIC
    rule: BurstRule = field(default_factory=BurstRule)
    starting_offsets: str = "latest"
    trigger_seconds: float = 5.0
    options: dict[str, str] = field(default_factory=dict)


def ensure_topic(settings: AlertSettings) -> None:
    """Create the alerts topic (one partition) unless it exists."""
    options = parse_options({"kafka.bootstrap.servers": settings.bootstrap,
                             **settings.options}, reading=False)
    admin = clients.admin(options)
    metadata = admin.list_topics(timeout=30)
    if settings.alerts_topic in metadata.topics:
        return
    future = admin.create_topics([NewTopic(settings.alerts_topic, 1, 1)])[settings.alerts_topic]
    try:
        future.result(30)
    except Exception as exc:  # created meanwhile by someone else is fine
        if "TOPIC_ALREADY_EXISTS" not in str(exc):
            raise


def alert_rows(events: DataFrame, rule: BurstRule) -> DataFrame:
    """Windows with at least ``threshold`` failed logins from one source, as key/value."""
    length = f"{rule.window_seconds} seconds"
    slide = f"{max(1, rule.window_seconds // 2)} seconds"
    counted = (events.where(F.col("login_failed") > 0)
               .withWatermark("event_time", length)
               .groupBy("source", F.window("event_time", length, slide).alias("w"))
               .agg(F.sum("login_failed").alias("failures"),
                    F.array_sort(F.collect_set("listener")).alias("listeners"),
                    F.max("event_time").alias("last_failure")))
    start_ms = F.unix_millis(F.col("w.start"))
    return (counted.where(F.col("failures") >= rule.threshold)
            .select(F.concat_ws("@", "source", start_ms.cast("string")).alias("key"),
                    F.to_json(F.struct(
                        F.lit("password-guessing").alias("alert"), "source", "failures",
                        F.lit(rule.threshold).alias("threshold"),
                        start_ms.alias("window_start"),
                        F.unix_millis(F.col("w.end")).alias("window_end"), "listeners",
                        F.unix_millis("last_failure").alias("last_failure"))).alias("value")))


def start_alerts(spark: SparkSession, settings: AlertSettings,
                 on_alerts: Callable[[list[str]], None] | None = None) -> StreamingQuery:
    """Start the alert query; ``on_alerts`` sees each micro-batch's alert values."""
    ensure_topic(settings)
    raw = (spark.readStream.format(SHORT_NAME)
           .option("kafka.bootstrap.servers", settings.bootstrap)
           .option("subscribe", settings.topic)
           .option("startingOffsets", settings.starting_offsets)
           .options(**settings.options).load())
    alerts = alert_rows(parse_events(raw), settings.rule)
    sink_options = {"kafka.bootstrap.servers": settings.bootstrap,
                    "topic": settings.alerts_topic, **settings.options}

    def publish(batch: DataFrame, batch_id: int) -> None:
        batch.persist()
        try:
            values = [str(row["value"]) for row in batch.select("value").collect()]
            if values:
                batch.write.format(SHORT_NAME).mode("append").options(**sink_options).save()
        finally:
            batch.unpersist()
        if not values:
            return
        log.info("batch %d: published %d alert(s) to %s", batch_id, len(values),
                 settings.alerts_topic)
        if on_alerts is not None:
            on_alerts(values)

    return (alerts.writeStream.outputMode("update")
            .option("checkpointLocation", str(settings.checkpoint))
            .trigger(processingTime=f"{settings.trigger_seconds} seconds")
            .foreachBatch(publish)
            .queryName("audit-alerts")
            .start())
