"""The batch audit report: read the audit topic, write the tables as Parquet, draw the chart,
print the tables.

Output (under ``--output``): ``tenants/``, ``principals/``, ``failures_per_minute/``,
``top_denied_principals/``, ``top_sources/``, ``bursts/`` (Parquet, replaced on every
run) and ``failures_per_minute.png``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

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
from pipeline.audit.table import ReportRow, format_table
from pipeline.source import SHORT_NAME

CHART = "failures_per_minute.png"
NO_EVENTS = ("No audit events were read. The broker writes them only where logins happen: "
             "every SASL login\n(success or failure), every authorization denial "
             "(authorizationEnabled=true) and every rejected\nconnection. A broker with only "
             "PLAINTEXT listeners and authorization off, like the quick start's,\nwrites none: "
             "give it a SASL listener (README: Security) and log in.")
TIME_COLUMNS = {"first_event", "last_event", "minute", "last_denial", "first_failure",
                "last_failure"}


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

    tables: dict[str, list[ReportRow]]
    """Each table's rows, in order, timestamps as epoch milliseconds."""
    columns: dict[str, list[str]]
    output: Path
    chart: Path

    @property
    def events(self) -> int:
        """How many audit events the report read."""
        return sum(int(row["events"]) for row in self.tables["tenants"])

    def text(self) -> str:
        """The printed form of every table (times in UTC), and why they are empty when the
        topic held no events."""
        parts = []
        for name, rows in self.tables.items():
            columns = self.columns[name]
            parts.append(format_table(
                f"== {name.replace('_', ' ')} ==", columns,
                [[_utc_text(row[c]) if c in TIME_COLUMNS else row[c] for c in columns]
                 for row in rows]))
        if not self.events:
            parts.append(NO_EVENTS)
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


def collect_rows(frame: DataFrame) -> list[ReportRow]:
    """Rows as dicts, timestamps as epoch milliseconds (``collect()`` would give naive
    datetimes in the driver's local time zone)."""
    columns = [F.unix_millis(f.name).alias(f.name) if isinstance(f.dataType, TimestampType)
               else F.col(f.name) for f in frame.schema.fields]
    return [row.asDict() for row in frame.select(*columns).collect()]


def _utc_text(epoch_ms: int | None) -> str | None:
    if epoch_ms is None:
        return None
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def run_report(spark: SparkSession, settings: ReportSettings) -> Report:
    """Compute, write and return the report (printing is the caller's choice)."""
    events = read_events(spark, settings).cache()
    tables: dict[str, list[ReportRow]] = {}
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
            stored = frame.coalesce(1).persist()
            try:
                stored.write.mode("overwrite").parquet(str(output / name))
                tables[name] = collect_rows(stored)
            finally:
                stored.unpersist()
    finally:
        events.unpersist()
    report = Report(tables, {name: frame.columns for name, frame in frames.items()}, output,
                    output / CHART)
    draw_chart(tables["failures_per_minute"], tables["bursts"], report.chart,
               events=report.events)
    return report
