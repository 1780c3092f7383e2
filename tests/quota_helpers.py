"""Client-quota requests for tests: AlterClientQuotas and DescribeClientQuotas through raw
connections with kafka-python's protocol classes (confluent-kafka 2.16 and kafka-python
3.0 have no client-quota admin calls)."""

from __future__ import annotations

import functools
import time
from typing import Any

import confluent_kafka
from kafka.protocol.admin import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
)
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from tests.raw import RawConnection, record_batch

Entity = dict[str, str | None]
"""An entity as ``{type: name}`` (None: the default)."""
Ops = dict[str, float | None]
"""Quota values to set, or None to remove the key."""
EXACT, DEFAULT, SPECIFIED = 0, 1, 2


def alter(conn: RawConnection, changes: list[tuple[Entity, Ops]], validate_only: bool = False,
          version: int = 1) -> list[tuple[int, str | None]]:
    """AlterClientQuotas; each entry's error code and message."""
    E = AlterClientQuotasRequest.EntryData
    request = AlterClientQuotasRequest(validate_only=validate_only, entries=[
        E(entity=[E.EntityData(entity_type=k, entity_name=v) for k, v in entity.items()],
          ops=[E.OpData(key=key, value=0.0 if value is None else value,
                        remove=value is None) for key, value in ops.items()])
        for entity, ops in changes])
    response = conn.call(request, version, AlterClientQuotasResponse)
    return [(entry.error_code, entry.error_message) for entry in response.entries]


def describe(conn: RawConnection, components: list[tuple[str, int, str | None]],
             strict: bool = False, version: int = 1) -> tuple[int, dict[Any, dict[str, float]]]:
    """DescribeClientQuotas; the error code and each entity (a frozenset of its
    ``(type, name)`` parts) with its values."""
    C = DescribeClientQuotasRequest.ComponentData
    request = DescribeClientQuotasRequest(strict=strict, components=[
        C(entity_type=kind, match_type=match_type, match=match)
        for kind, match_type, match in components])
    response = conn.call(request, version, DescribeClientQuotasResponse)
    found = {frozenset((e.entity_type, e.entity_name) for e in entry.entity):
             {v.key: v.value for v in entry.values} for entry in response.entries or []}
    return response.error_code, found


def parts(entity: Entity) -> frozenset[tuple[str, str | None]]:
    """An entity as :func:`describe` keys it."""
    return frozenset(entity.items())


def produce_throttle(conn: RawConnection, topic: str, value_bytes: int) -> tuple[int, int]:
    """Produce one record of ``value_bytes`` bytes; the error code and ``throttle_time_ms``."""
    data = ProduceRequest.TopicProduceData(name=topic, partition_data=[
        ProduceRequest.TopicProduceData.PartitionProduceData(
            index=0, records=record_batch(1, value=b"x" * value_bytes))])
    answer = conn.call(ProduceRequest[9](transactional_id=None, acks=1, timeout_ms=5000,
                                         topic_data=[data]), 9, ProduceResponse)
    error = int(answer.responses[0].partition_responses[0].error_code)
    return error, int(answer.throttle_time_ms)


def produce_flat_out(conf: dict[str, Any], topic: str, measure_from: float = 5.0,
                     until: float = 15.0, value_bytes: int = 10_000) -> tuple[float, list[int]]:
    """Produce as fast as a confluent-kafka producer of ``conf`` may for ``until`` seconds;
    the bytes per second of the records produced from ``measure_from`` on (after the first
    window's burst) and delivered before ``until``, and the throttle times its throttle
    callback saw. (Counting every delivery in the span would count the client's queue at
    ``measure_from`` too: up to 2 MiB more, delivered late when a loaded machine holds the
    client up.)"""
    throttles: list[int] = []
    delivered: list[tuple[float, float, int]] = []
    producer = confluent_kafka.Producer({
        **conf, "linger.ms": 5, "acks": 1, "queue.buffering.max.kbytes": 2048,
        "throttle_cb": lambda event: throttles.append(int(event.throttle_time * 1000))})
    value = b"x" * value_bytes

    def done(produced: float, err: Any, msg: Any) -> None:
        if err is None:
            delivered.append((produced, time.monotonic(), len(msg.value())))

    started = time.monotonic()
    begin, end = started + measure_from, started + until
    while time.monotonic() < end:
        try:
            producer.produce(topic, value, on_delivery=functools.partial(done, time.monotonic()))
        except BufferError:  # the client's queue is full: it is being held back
            producer.poll(0.05)
        producer.poll(0)
    producer.flush(30)
    measured = sum(size for produced, at, size in delivered if begin <= produced and at < end)
    return measured / (end - begin), throttles
