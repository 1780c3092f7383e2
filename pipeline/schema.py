"""The row shape of Spark's Kafka source, and Arrow batches of it built from consumed records.

``key`` and ``value`` are binary, ``timestamp`` a timestamp (UTC), ``timestampType`` 0 for
CreateTime and 1 for LogAppendTime, ``headers`` an array of (string key, binary value).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import confluent_kafka
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

HEADER = StructType([StructField("key", StringType(), True),
                     StructField("value", BinaryType(), True)])

SCHEMA = StructType([
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), True),
    StructField("topic", StringType(), True),
    StructField("partition", IntegerType(), True),
    StructField("offset", LongType(), True),
    StructField("timestamp", TimestampType(), True),
    StructField("timestampType", IntegerType(), True),
    StructField("headers", ArrayType(HEADER, True), True),
])

ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")


def _timestamp_type(kind: int) -> int:
    """confluent-kafka's TIMESTAMP_CREATE_TIME (1) / LOG_APPEND_TIME (2) to Kafka's 0 / 1."""
    return 1 if kind == 2 else 0


@dataclass
class RowBuffer:
    """Columns of consumed records, turned into an Arrow batch when full."""

    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    timestamps: list[datetime | None] = field(default_factory=list)
    timestamp_types: list[int] = field(default_factory=list)
    headers: list[list[dict[str, str | bytes | None]] | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, message: confluent_kafka.Message) -> None:
        """Append one confluent-kafka message."""
        kind, millis = message.timestamp()
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        if topic is None or partition is None or offset is None:
            raise ValueError(f"not a record: {message.error()}")
        self.keys.append(message.key())
        self.values.append(message.value())
        self.topics.append(topic)
        self.partitions.append(partition)
        self.offsets.append(offset)
        self.timestamps.append(None if millis is None or millis < 0 else
                               datetime.fromtimestamp(millis / 1000, UTC))
        self.timestamp_types.append(_timestamp_type(kind))
        pairs = message.headers()
        listed = pairs.items() if isinstance(pairs, dict) else pairs
        self.headers.append(None if listed is None else
                            [{"key": k, "value": v} for k, v in listed])

    def to_arrow(self) -> pa.RecordBatch:
        """The buffered rows as one batch of :data:`ARROW_SCHEMA`."""
        columns = [self.keys, self.values, self.topics, self.partitions, self.offsets,
                   self.timestamps, self.timestamp_types, self.headers]
        return pa.RecordBatch.from_arrays(
            [pa.array(column, type=f.type) for column, f in zip(columns, ARROW_SCHEMA,
                                                                 strict=True)],
            schema=ARROW_SCHEMA)
