"""The batch audit report: read the audit topic, write the tables as Parquet, draw the chart,
print the tables.

Output (under ``--output``): ``tenants/``, ``principals/``, ``failures_per_minute/``,
``top_denied_principals/``, ``top_sources/``, ``bursts/`` (Parquet, replaced on every
run) and ``failures_per_minute.png``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import TimestampType

from pipeline.audit.analysis import (
    BurstRule,
    bursts,
    failures_per_minute,
    principal_summary,
    tenant_summary,
    top_denied_principals,
    top_sources,
)
from pipeline.audit.chart import draw_chart
from pipeline.audit.events import AUDIT_TOPIC, parse_events
from pipeline.audit.table import format_table
from pipeline.source import SHORT_NAME

CHART = "failures_per_minute.png"
ORDER = {  # "-" = descending
    "tenants": ["tenant"],
    "principals": ["tenant", "principal"],
    "failures_per_minute": ["minute", "tenant"],
    "top_denied_principals": ["-denials", "tenant", "principal"],
    "top_sources": ["-bad_events", "source"],
    "bursts": ["first_failure", "source"],
}


@dataclass(frozen=True)
class ReportSettings:
    """What to read and how to judge it."""

    bootstrap: str
    topic: str = AUDIT_TOPIC
    since_ms: int | None = None
    output: Path = Path("audit-report")
    rule: BurstRule = field(default_factory=BurstRule)
    top: int = 10
    options: dict[str, str] = field(default_factory=dict)
    """Extra ``edgekafka`` options (security: ``kafka.*``, ``oauth.*``)."""


@dataclass
class Report:
    """The report's tables as collected rows (dicts), plus where the files went."""

    tables: dict[str, list[dict[str, Any]]]
    output: Path
    chart: Path

    def text(self) -> str:
        """The printed form of every table."""
        parts = []
        for name, rows in self.tables.items():
            columns = list(rows[0]) if rows else ["(no rows)"]
            parts.append(format_table(f"== {name.replace('_', ' ')} ==", columns,
                                      [[row[c] for c in columns] for row in rows]))
        return "\n\n".join(parts)


def read_events(spark: SparkSession, settings: ReportSettings) -> DataFrame:
    """The audit events since ``since_ms`` (all of them without it)."""
    reader = (spark.read.format(SHORT_NAME)
              .option("kafka.bootstrap.servers", settings.bootstrap)
              .option("subscribe", settings.topic)
              .options(**settings.options))
    if settings.since_ms is not None:
        reader = reader.option("startingTimestamp", str(settings.since_ms))
    events = parse_events(reader.load())
    if settings.since_ms is not None:
        events = events.where(F.col("event_time") >= F.timestamp_millis(F.lit(settings.since_ms)))
    return events


def _printable(frame: DataFrame) -> list[dict[str, Any]]:
    """Rows with timestamps as UTC text (collect() would give local-time datetimes)."""
    columns = [F.date_format(f.name, "yyyy-MM-dd HH:mm:ss").alias(f.name)
               if isinstance(f.dataType, TimestampType) else F.col(f.name)
               for f in frame.schema.fields]
    return [row.asDict() for row in frame.select(*columns).collect()]


def _epoch_ms(frame: DataFrame) -> list[dict[str, Any]]:
    """Rows with timestamps as epoch milliseconds."""
    columns = [F.unix_millis(f.name).alias(f.name) if isinstance(f.dataType, TimestampType)
               else F.col(f.name) for f in frame.schema.fields]
    return [row.asDict() for row in frame.select(*columns).collect()]


def run_report(spark: SparkSession, settings: ReportSettings) -> Report:
    """Compute, write and return the report (printing is the caller's choice)."""
    events = read_events(spark, settings).cache()
    try:
        frames = {
            "tenants": tenant_summary(events),
            "principals": principal_summary(events),
            "failures_per_minute": failures_per_minute(events),
            "top_denied_principals": top_denied_principals(events, settings.top),
            "top_sources": top_sources(events, settings.top),
            "bursts": bursts(events, settings.rule),
        }
        output = settings.output
        for name, frame in frames.items():
            frame.coalesce(1).write.mode("overwrite").parquet(str(output / name))
        stored = {name: spark.read.parquet(str(output / name)) for name in frames}
        chart = draw_chart(_epoch_ms(stored["failures_per_minute"]),
                           _epoch_ms(stored["bursts"]), output / CHART)
        tables = {name: _printable(frame.orderBy(*frames[name].columns[:1]))
                  if name in ("tenants", "principals", "failures_per_minute")
                  else _printable(frames[name]) for name, frame in stored.items()}
    finally:
        events.unpersist()
    return Report(tables, output, chart)
