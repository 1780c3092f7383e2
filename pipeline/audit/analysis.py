"""The audit report's tables, each a DataFrame computed from :func:`parse_events` rows.

A *burst* is what password guessing looks like: at least ``threshold`` failed logins from
one source (client host) within ``window_seconds``. Each failed login opens a candidate
window ``[t, t + window)``; windows holding ``threshold`` or more failures are merged
while they overlap, and each merged run is one burst with its first and last failure and
its failure count.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F


@dataclass(frozen=True)
class BurstRule:
    """How many failed logins from one source, within how long, make a burst."""

    threshold: int = 5
    window_seconds: int = 60


def _counts() -> list[Column]:
    return [F.sum("login_ok").alias("logins_ok"),
            F.sum("login_failed").alias("login_failures"),
            F.sum("denied").alias("denials"),
            F.sum("rejected").alias("rejected_connections")]


def tenant_summary(events: DataFrame) -> DataFrame:
    """Per tenant (``-`` for events without one, such as failed logins): counts, distinct
    principals and sources, first and last event."""
    return (events.groupBy(F.col("tenant_name").alias("tenant"))
            .agg(F.sum("count").alias("events"), *_counts(),
                 F.countDistinct("principal").alias("principals"),
                 F.countDistinct("source").alias("sources"),
                 F.min("event_time").alias("first_event"),
                 F.max("event_time").alias("last_event"))
            .orderBy("tenant"))


def principal_summary(events: DataFrame) -> DataFrame:
    """Per tenant and principal: counts, distinct sources, first and last event."""
    return (events.groupBy(F.col("tenant_name").alias("tenant"),
                           F.col("principal_name").alias("principal"))
            .agg(F.sum("count").alias("events"), *_counts(),
                 F.countDistinct("source").alias("sources"),
                 F.min("event_time").alias("first_event"),
                 F.max("event_time").alias("last_event"))
            .orderBy("tenant", "principal"))


def failures_per_minute(events: DataFrame) -> DataFrame:
    """Per minute and tenant: failed logins, denials and rejected connections (minutes
    without any of them left out)."""
    bad = events.where((F.col("login_failed") + F.col("denied") + F.col("rejected")) > 0)
    return (bad.groupBy(F.date_trunc("minute", "event_time").alias("minute"),
                        F.col("tenant_name").alias("tenant"))
            .agg(F.sum("login_failed").alias("login_failures"),
                 F.sum("denied").alias("denials"),
                 F.sum("rejected").alias("rejected_connections"))
            .orderBy("minute", "tenant"))


def top_denied_principals(events: DataFrame, limit: int = 10) -> DataFrame:
    """The principals with the most authorization denials."""
    return (events.where(F.col("denied") > 0)
            .groupBy(F.col("tenant_name").alias("tenant"),
                     F.col("principal_name").alias("principal"))
            .agg(F.sum("denied").alias("denials"),
                 F.countDistinct("resource").alias("resources"),
                 F.max("event_time").alias("last_denial"))
            .orderBy(F.desc("denials"), "tenant", "principal").limit(limit))


def top_sources(events: DataFrame, limit: int = 10) -> DataFrame:
    """The client hosts with the most failed logins, denials and rejected connections."""
    return (events.groupBy("source")
            .agg(F.sum("login_failed").alias("login_failures"),
                 F.sum("denied").alias("denials"),
                 F.sum("rejected").alias("rejected_connections"),
                 F.sum("login_ok").alias("logins_ok"))
            .withColumn("bad_events", F.col("login_failures") + F.col("denials")
                        + F.col("rejected_connections"))
            .where(F.col("bad_events") > 0)
            .orderBy(F.desc("bad_events"), "source").limit(limit))


def bursts(events: DataFrame, rule: BurstRule) -> DataFrame:
    """Password-guessing bursts: source, first and last failure, failed logins, listeners."""
    window_ms = rule.window_seconds * 1000
    failures = (events.where(F.col("login_failed") > 0)
                .select("source", "listener", "event_time", "login_failed",
                        F.unix_millis("event_time").alias("ms")))
    ahead = Window.partitionBy("source").orderBy("ms").rangeBetween(0, window_ms - 1)
    starts = (failures.select("source", "ms",
                              F.sum("login_failed").over(ahead).alias("in_window"),
                              F.max("ms").over(ahead).alias("window_last"))
              .where(F.col("in_window") >= rule.threshold))
    by_time = Window.partitionBy("source").orderBy("ms")
    running_end = Window.partitionBy("source").orderBy("ms").rowsBetween(
        Window.unboundedPreceding, -1)
    runs = (starts.withColumn("reach", F.max("window_last").over(running_end))
            .withColumn("new_run", F.when(F.col("reach").isNull() | (F.col("ms") > F.col("reach")),
                                          1).otherwise(0))
            .withColumn("run", F.sum("new_run").over(by_time))
            .groupBy("source", "run")
            .agg(F.min("ms").alias("start_ms"), F.max("window_last").alias("end_ms")))
    matched = failures.alias("f").join(
        runs.alias("r"),
        (F.col("f.source") == F.col("r.source")) & F.col("f.ms").between(
            F.col("r.start_ms"), F.col("r.end_ms")))
    return (matched.groupBy(F.col("r.source").alias("source"), "r.start_ms", "r.end_ms")
            .agg(F.sum("f.login_failed").alias("failures"),
                 F.array_sort(F.collect_set("f.listener")).alias("listeners"))
            .select("source", F.timestamp_millis("start_ms").alias("first_failure"),
                    F.timestamp_millis("end_ms").alias("last_failure"), "failures",
                    "listeners")
            .orderBy("first_failure", "source"))
