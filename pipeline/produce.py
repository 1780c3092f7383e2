"""Rows to Kafka records: the sink's row encoding (Spark's Kafka sink columns) and a loop
that produces rows in order and waits until every one is acknowledged."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import confluent_kafka
from pyspark.sql import Row

from pipeline.options import KafkaOptions

FLUSH_TIMEOUT_SECONDS = 120.0


def _bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


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

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            errors.append(str(error))

    count = 0
    for row in rows:
        fields = row.asDict()
        extra: dict[str, Any] = {}
        if fields.get("partition") is not None:
            extra["partition"] = int(fields["partition"])
        if fields.get("headers"):
            extra["headers"] = [(h["key"], _bytes(h["value"])) for h in fields["headers"]]
        while True:
            try:
                producer.produce(topic_of(row, options), value=_bytes(fields.get("value")),
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
    return count
