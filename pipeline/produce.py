"""Rows to Kafka records: the sink's row encoding (Spark's Kafka sink columns) and a loop
that produces rows in order and waits until every one is acknowledged."""

from __future__ import annotations

from collections.abc import Iterable

import confluent_kafka
from pyspark.sql import Row

from pipeline.options import KafkaOptions

FLUSH_TIMEOUT_SECONDS = 120.0


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
    """The row's ``topic`` column, else the option ``topic``."""
    topic = row.asDict().get("topic") or options.write_topic
    if topic is None:
        raise ValueError("edgekafka sink: a row has no topic and the option 'topic' is unset")
    return str(topic)


def produce_all(producer: confluent_kafka.Producer, options: KafkaOptions,
                rows: Iterable[Row]) -> int:
    """Produce every row in order and wait until all are acknowledged; the count."""
    errors: list[str] = []

    def delivered(error: confluent_kafka.KafkaError | None,
                  _message: confluent_kafka.Message) -> None:
        if error is not None:
            errors.append(str(error))

    count = 0
    for row in rows:
        fields = row.asDict()
        partition = int(fields["partition"]) if fields.get("partition") is not None else -1
        headers: list[tuple[str, str | bytes | None]] | None = (
            [(str(h["key"]), _bytes(h["value"])) for h in fields["headers"]]
            if fields.get("headers") else None)
        while True:
            try:
                producer.produce(topic_of(row, options), value=_bytes(fields.get("value")),
                                 key=_bytes(fields.get("key")), partition=partition,
                                 headers=headers, on_delivery=delivered)
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
