"""Produce and consume through the three third-party clients, with one record shape for all."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import confluent_kafka
import kafka
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka.admin import AdminClient, NewTopic

PARTITIONS = 3
T = TypeVar("T")


@dataclass(frozen=True)
class Rec:
    """One record as produced and as it must come back."""

    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int


@dataclass(frozen=True)
class Got:
    """One consumed record with its offset."""

    partition: int
    offset: int
    rec: Rec


def present(value: T | None) -> T:
    """``value``, which the test knows is there (a consumed message's offset, value...)."""
    assert value is not None
    return value


def known_bytes(value: object) -> bytes:
    """A key, value or header value of a test record: always bytes, never None."""
    assert isinstance(value, bytes), value
    return value


def _optional_bytes(value: object) -> bytes | None:
    """A consumed key, value or header value: bytes, or None (a record without a key, a
    tombstone)."""
    assert value is None or isinstance(value, bytes), value
    return value


def got_from_confluent(msg: confluent_kafka.Message) -> Got:
    """A record librdkafka consumed (without error), as a ``Got``."""
    partition, offset = msg.partition(), msg.offset()
    assert partition is not None and offset is not None, msg
    _kind, ts = msg.timestamp()
    raw_headers = msg.headers() or []
    assert isinstance(raw_headers, list), raw_headers  # a consumed message's are a list
    headers = tuple((key, _optional_bytes(value)) for key, value in raw_headers)
    return Got(partition, offset, Rec(partition, _optional_bytes(msg.key()),
                                      _optional_bytes(msg.value()), headers, ts))


def make_records(count: int, base_ts: int) -> list[Rec]:
    """Records with keys, headers, timestamps and varied values, spread over the partitions."""
    return [
        Rec(
            partition=i % PARTITIONS,
            key=f"key-{i}".encode(),
            value=(f"value-{i}-".encode() * (1 + i % 7)) + bytes([i % 256]),
            headers=(("h1", f"hv-{i}".encode()), ("trace", bytes([i % 251, 7]))),
            timestamp=base_ts + i,
        )
        for i in range(count)
    ]


def create_topic(bootstrap: str, name: str, partitions: int = PARTITIONS,
                 config: dict[str, str] | None = None) -> None:
    """Create a topic through confluent-kafka's AdminClient and wait for the result."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, 1, config=config or {})])
    futures[name].result(30)


# -- producers ---------------------------------------------------------------------------

def produce_confluent(bootstrap: str, topic: str, recs: list[Rec], compression: str, *,
                      conf: Mapping[str, Any] | None = None) -> None:
    """Produce with librdkafka, acks=all, and check every delivery report.

    ``conf`` (a client config of the client's own style) replaces the plain bootstrap."""
    errors: list[object] = []
    producer = confluent_kafka.Producer({
        **(conf or {"bootstrap.servers": bootstrap}), "compression.type": compression,
        "acks": "all", "linger.ms": 5,
    })

    def report(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    for rec in recs:
        producer.produce(topic, key=rec.key, value=rec.value, partition=rec.partition,
                         headers=list(rec.headers), timestamp=rec.timestamp, on_delivery=report)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert errors == []


def produce_kafka_python(bootstrap: str, topic: str, recs: list[Rec], compression: str, *,
                         conf: Mapping[str, Any] | None = None) -> None:
    """Produce with kafka-python, acks=all."""
    producer = kafka.KafkaProducer(
        **(conf or {"bootstrap_servers": bootstrap}), acks="all", linger_ms=5,
        compression_type=None if compression == "none" else compression,
        enable_idempotence=False,
    )
    futures = [
        producer.send(topic, key=rec.key, value=rec.value, partition=rec.partition,
                      headers=list(rec.headers), timestamp_ms=rec.timestamp)
        for rec in recs
    ]
    producer.flush(60)
    for future in futures:
        future.get(10)
    producer.close()


def produce_aiokafka(bootstrap: str, topic: str, recs: list[Rec], compression: str, *,
                     conf: Mapping[str, Any] | None = None) -> None:
    """Produce with aiokafka, acks=all."""

    async def run() -> None:
        producer = AIOKafkaProducer(
            **(conf or {"bootstrap_servers": bootstrap}), acks="all", linger_ms=5,
            compression_type=None if compression == "none" else compression,
        )
        await producer.start()
        try:
            futures = [
                await producer.send(topic, key=rec.key, value=rec.value,
                                    partition=rec.partition, headers=list(rec.headers),
                                    timestamp_ms=rec.timestamp)
                for rec in recs
            ]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()

    asyncio.run(run())


# -- consumers ---------------------------------------------------------------------------

def _finished(count: int, until: Callable[[list[Got]], bool] | None
              ) -> Callable[[list[Got]], bool]:
    """When a consumer below has read enough: ``until``, else ``count`` records."""
    return until if until is not None else (lambda got: len(got) >= count)


def consume_confluent(bootstrap: str, topic: str, count: int,
                      partitions: int = PARTITIONS, timeout: float = 60, *,
                      conf: Mapping[str, Any] | None = None,
                      until: Callable[[list[Got]], bool] | None = None) -> list[Got]:
    """Read ``count`` records (or until ``until(got)``) from offset 0 of every partition
    with librdkafka."""
    consumer = confluent_kafka.Consumer({
        **(conf or {"bootstrap.servers": bootstrap}), "group.id": "unused-assign-only",
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
    })
    consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[Got] = []
    done = _finished(count, until)
    deadline = time.monotonic() + timeout
    try:
        while not done(got) and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 1.0):
                assert msg.error() is None, msg.error()
                got.append(got_from_confluent(msg))
    finally:
        consumer.close()
    return got


def consume_kafka_python(bootstrap: str, topic: str, count: int,
                         partitions: int = PARTITIONS, timeout: float = 60, *,
                         conf: Mapping[str, Any] | None = None,
                         until: Callable[[list[Got]], bool] | None = None) -> list[Got]:
    """Read ``count`` records (or until ``until(got)``) from offset 0 of every partition
    with kafka-python."""
    consumer = kafka.KafkaConsumer(**(conf or {"bootstrap_servers": bootstrap}), group_id=None,
                                   enable_auto_commit=False, auto_offset_reset="earliest")
    tps = [kafka.TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, 0)
    got: list[Got] = []
    done = _finished(count, until)
    deadline = time.monotonic() + timeout
    try:
        while not done(got) and time.monotonic() < deadline:
            for tp, msgs in consumer.poll(1000).items():
                for msg in msgs:
                    got.append(Got(tp.partition, msg.offset, Rec(
                        tp.partition, msg.key, msg.value,
                        tuple((k, v) for k, v in msg.headers), msg.timestamp)))
    finally:
        consumer.close()
    return got


def consume_aiokafka(bootstrap: str, topic: str, count: int,
                     partitions: int = PARTITIONS, timeout: float = 60, *,
                     conf: Mapping[str, Any] | None = None,
                     until: Callable[[list[Got]], bool] | None = None) -> list[Got]:
    """Read ``count`` records (or until ``until(got)``) from offset 0 of every partition
    with aiokafka."""

    async def run() -> list[Got]:
        consumer = AIOKafkaConsumer(**(conf or {"bootstrap_servers": bootstrap}),
                                    group_id=None,
                                    enable_auto_commit=False, auto_offset_reset="earliest")
        await consumer.start()
        got: list[Got] = []
        try:
            from aiokafka import TopicPartition
            tps = [TopicPartition(topic, p) for p in range(partitions)]
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, 0)
            done = _finished(count, until)
            deadline = time.monotonic() + timeout
            while not done(got) and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=1000)
                for tp, msgs in batch.items():
                    for msg in msgs:
                        got.append(Got(tp.partition, msg.offset, Rec(
                            tp.partition, msg.key, msg.value,
                            tuple((k, bytes(v)) for k, v in msg.headers), msg.timestamp)))
        finally:
            await consumer.stop()
        return got

    return asyncio.run(run())


PRODUCERS = {"confluent": produce_confluent, "kafka-python": produce_kafka_python,
             "aiokafka": produce_aiokafka}
CONSUMERS = {"confluent": consume_confluent, "kafka-python": consume_kafka_python,
             "aiokafka": consume_aiokafka}
