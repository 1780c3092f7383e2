"""Writes: ``df.write.format("edgekafka")`` and ``df.writeStream.format("edgekafka")``.

Columns are those of Spark's Kafka sink: ``value`` (required), ``key``, ``topic`` (else the
``topic`` option), ``partition`` and ``headers`` (array of (string key, binary value)),
binary or string. Each task produces its rows in order through an idempotent producer
(acks=all, so retries neither duplicate nor reorder) and waits for every delivery before
it reports success; one failed delivery fails the task.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

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
from pipeline.options import KafkaOptions, OptionError

FLUSH_TIMEOUT_SECONDS = 120.0
_BYTES = (BinaryType, StringType)


@dataclass
class WrittenCount(WriterCommitMessage):
    """What one task wrote."""

    records: int


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


def _bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


def produce_rows(options: KafkaOptions, rows: Iterator[Row]) -> WrittenCount:
    """Produce every row in order and wait until all are acknowledged."""
    producer = clients.producer(options)
    errors: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            errors.append(str(error))

    count = 0
    for row in rows:
        fields = row.asDict()
        topic = fields.get("topic") or options.write_topic
        if topic is None:
            raise ValueError("edgekafka sink: a row has no topic and the option 'topic' is unset")
        extra: dict[str, Any] = {}
        if fields.get("partition") is not None:
            extra["partition"] = int(fields["partition"])
        if fields.get("headers"):
            extra["headers"] = [(h["key"], _bytes(h["value"])) for h in fields["headers"]]
        while True:
            try:
                producer.produce(topic, value=_bytes(fields.get("value")),
                                 key=_bytes(fields.get("key")), on_delivery=delivered, **extra)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
        count += 1
        if errors:
            break
    left = producer.flush(FLUSH_TIMEOUT_SECONDS)
    if errors:
        raise RuntimeError(f"edgekafka sink: {len(errors)} records were not delivered: "
                           f"{errors[0]}")
    if left:
        raise RuntimeError(f"edgekafka sink: {left} records still undelivered after "
                           f"{FLUSH_TIMEOUT_SECONDS:.0f} s")
    return WrittenCount(count)


class BatchWriter(DataSourceWriter):
    """``df.write``: each task produces its rows."""

    def __init__(self, options: KafkaOptions, schema: StructType) -> None:
        check_schema(schema, options)
        self.options = options

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        """Produce one task's rows."""
        return produce_rows(self.options, iterator)


class StreamWriter(DataSourceStreamWriter):
    """``df.writeStream``: each micro-batch's tasks produce their rows (at least once:
    a micro-batch replayed after a failure is produced again)."""

    def __init__(self, options: KafkaOptions, schema: StructType) -> None:
        check_schema(schema, options)
        self.options = options

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        """Produce one task's rows."""
        return produce_rows(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every task already waited for its acknowledgements."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Records already acknowledged cannot be taken back."""
