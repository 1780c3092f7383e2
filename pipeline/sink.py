"""Writes: ``df.write.format("edgekafka")`` and ``df.writeStream.format("edgekafka")``.

Columns are those of Spark's Kafka sink: ``value`` (required), ``key``, ``topic`` (else the
``topic`` option), ``partition`` and ``headers`` (array of (string key, binary value)),
binary or string (:mod:`pipeline.produce`). Each task produces its rows in order
(acks=all, idempotent, so retries neither duplicate nor reorder) and waits for every
delivery before it reports success; one failed delivery fails the task. A batch write
is at least once per task; a streaming write is exactly once, each micro-batch visible
whole (``atomicity=batch``, :mod:`pipeline.staging`) or each task's share of it
(``atomicity=partition``) in transactions that record the batch id
(:mod:`pipeline.exactly_once`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from pipeline import clients
from pipeline.exactly_once import write_once
from pipeline.options import KafkaOptions, OptionError
from pipeline.produce import produce_all
from pipeline.staging import Staged, copy_batch, stage_rows

log = logging.getLogger(__name__)
_BYTES = (BinaryType, StringType)


@dataclass
class WrittenCount(WriterCommitMessage):
    """What one task wrote; ``skipped`` when an earlier run of its micro-batch had."""

    records: int
    skipped: bool = False


def _check_column(schema: StructType, name: str, allowed: tuple[type[DataType], ...],
                  required: bool = False) -> bool:
    if name not in schema.fieldNames():
        if required:
            raise OptionError(f"edgekafka sink: the DataFrame needs a '{name}' column")
        return False
    data_type = schema[name].dataType
    if not isinstance(data_type, allowed):
        kinds = " or ".join(kind.__name__.removesuffix("Type").lower() for kind in allowed)
        raise OptionError(f"edgekafka sink: column '{name}' must be {kinds}, "
                          f"not {data_type.simpleString()}")
    return True


def check_schema(schema: StructType, options: KafkaOptions) -> None:
    """Refuse a DataFrame the sink cannot write, naming the column."""
    _check_column(schema, "value", _BYTES, required=True)
    _check_column(schema, "key", _BYTES)
    _check_column(schema, "partition", (IntegerType, LongType, ShortType))
    if not _check_column(schema, "topic", (StringType,)) and options.write_topic is None:
        raise OptionError("edgekafka sink: give the option 'topic' or a 'topic' column")
    if _check_column(schema, "headers", (ArrayType,)):
        element = schema["headers"].dataType
        assert isinstance(element, ArrayType)
        inner = element.elementType
        if not (isinstance(inner, StructType) and {"key", "value"} <= set(inner.fieldNames())):
            raise OptionError("edgekafka sink: column 'headers' must be "
                              "array<struct<key:string,value:binary>>")


def produce_rows(options: KafkaOptions, rows: Iterator[Row]) -> WrittenCount:
    """Produce one batch-write task's rows through an idempotent producer."""
    return WrittenCount(produce_all(clients.producer(options), options, rows))


class BatchWriter(DataSourceWriter):
    """``df.write``: each task produces its rows."""

    def __init__(self, options: KafkaOptions, schema: StructType) -> None:
        check_schema(schema, options)
        self.options = options

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        """Produce one task's rows."""
        return produce_rows(self.options, iterator)


class StreamWriter(DataSourceStreamWriter):
    """``df.writeStream``: each micro-batch written exactly once, in transactions that
    record the batch id (:mod:`pipeline.exactly_once`)."""

    def __init__(self, options: KafkaOptions, schema: StructType) -> None:
        check_schema(schema, options)
        self.options = options

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        """Stage one task's rows (``atomicity=batch``) or write them in the task's
        transaction (``partition``); runs in an executor."""
        if self.options.atomicity == "batch":
            return stage_rows(self.options, iterator)
        records, skipped = write_once(self.options, iterator)
        return WrittenCount(records, skipped)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Copy the staged batch in one transaction (``batch``; the tasks' transactions
        are committed already with ``partition``) and say what the batch wrote."""
        if self.options.atomicity == "batch":
            records, skipped = copy_batch(self.options, messages, batchId)
            log.info("edgekafka sink: batch %d wrote %d records%s", batchId, records,
                     " (already written by an earlier run)" if skipped else "")
            return
        counts = [m for m in messages if isinstance(m, WrittenCount)]
        tasks_skipped = sum(1 for m in counts if m.skipped)
        log.info("edgekafka sink: batch %d wrote %d records%s", batchId,
                 sum(m.records for m in counts),
                 f" ({tasks_skipped} tasks already written by an earlier run)"
                 if tasks_skipped else "")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing of the batch is visible (``batch``: staged records are never copied),
        or the tasks that committed are (``partition``; the others aborted, or the next
        run's ``init_transactions`` or the transaction timeout will); the replay writes
        what is missing, once."""
        staged = sum(m.records for m in messages if isinstance(m, Staged))
        log.warning("edgekafka sink: batch %d failed%s; it is written, once, when the query "
                    "restarts", batchId, f" ({staged} staged records dropped)" if staged else "")
