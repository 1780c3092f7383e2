"""Rows to Kafka records: the sink's row encoding (Spark's Kafka sink columns) and a loop
that produces records in order and waits until every one is acknowledged."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import confluent_kafka
from pyspark.sql import Row

from pipeline.options import KafkaOptions

FLUSH_TIMEOUT_SECONDS = 120.0
ANY_PARTITION = -1
"""A record's partition when the producer's partitioner picks it (by key)."""

Header = tuple[str, str | bytes | None]


@dataclass(frozen=True, slots=True)
class Record:
    """One record to produce."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: list[Header] | None


def _bytes(value: object) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"edgekafka sink: a key, value or header must be bytes or a string, "
                    f"not {type(value).__name__}")


def topic_of(row: Row, options: KafkaOptions) -> str:
    """The option ``topic`` where it is set (it overrides the column, as in Spark's Kafka
    sink), else the row's ``topic`` column."""
    if options.write_topic is not None:
        return options.write_topic
    topic = row.asDict().get("topic")
    if topic is None:
        raise ValueError("edgekafka sink: a row's topic is null and the option 'topic' is "
                         "unset: set the option to give every row a topic")
    return str(topic)


def record_of(row: Row, options: KafkaOptions) -> Record:
    """The record a row of the sink's columns stands for."""
    fields = row.asDict()
    partition = (int(fields["partition"]) if fields.get("partition") is not None
                 else ANY_PARTITION)
    headers: list[Header] | None = (
        [(str(h["key"]), _bytes(h["value"])) for h in fields["headers"]]
        if fields.get("headers") else None)
    return Record(topic_of(row, options), partition, _bytes(fields.get("key")),
                  _bytes(fields.get("value")), headers)


def produce_records(producer: confluent_kafka.Producer, records: Iterable[Record],
                    on_delivered: Callable[[confluent_kafka.Message], None] | None = None,
                    ) -> int:
    """Produce every record in order and wait until all are acknowledged; the count.
    ``on_delivered`` sees each acknowledged record (topic, partition, offset), in the
    order of acknowledgement."""
    errors: list[str] = []

    def delivered(error: confluent_kafka.KafkaError | None,
                  message: confluent_kafka.Message) -> None:
        if error is not None:
            errors.append(str(error))
        elif on_delivered is not None:
            on_delivered(message)

    count = 0
    for record in records:
        while True:
            try:
                producer.produce(record.topic, value=record.value, key=record.key,
                                 partition=record.partition, headers=record.headers,
                                 on_delivery=delivered)
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
    return count


def produce_all(producer: confluent_kafka.Producer, options: KafkaOptions,
                rows: Iterable[Row]) -> int:
    """Produce every row in order and wait until all are acknowledged; the count."""
    return produce_records(producer, (record_of(row, options) for row in rows))
