"""Client-quota requests for tests: AlterClientQuotas and DescribeClientQuotas through raw
connections with kafka-python's protocol classes (confluent-kafka 2.16 and kafka-python
3.0 have no client-quota admin calls)."""

from __future__ import annotations

from typing import Any

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
