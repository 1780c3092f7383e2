"""The Produce request read directly (``broker_core.codec.produce_reader``) gives what the
schema library's decoder gives, and refuses what it refuses (with the forbidden null
:mod:`broker_core.null_fields` names), at every version served: for requests it encodes,
and for those requests cut short, with bytes changed, or with a null where none may be."""

from __future__ import annotations

import random

import pytest
from kafka.protocol.producer import ProduceRequest

from broker_core.codec.produce_reader import ForbiddenNull, ProduceBody, decode_produce
from broker_core.null_fields import first_forbidden_null

Outcome = tuple[object, ...] | str
"""A decoded request as plain values, or how it was refused ("null <path>", "garbage")."""


def _request(rng: random.Random, version: int) -> bytes:
    topics = []
    for number in range(rng.randint(0, 3)):
        partitions = [ProduceRequest.TopicProduceData.PartitionProduceData(
            index=rng.randint(-2, 40),
            records=None if rng.random() < 0.15 else rng.randbytes(rng.choice([0, 1, 61, 900])))
            for _ in range(rng.randint(0, 3))]
        name = None if rng.random() < 0.05 else f"topic-{number}-" + "é" * rng.randint(0, 3)
        # a null name on purpose (the stubs type the field as the schema reads it: str)
        topics.append(ProduceRequest.TopicProduceData(
            name=name, partition_data=partitions))  # type: ignore[arg-type]
    encoded = ProduceRequest(
        version=version, transactional_id=rng.choice([None, "", "txn-1"]),
        acks=rng.choice([-1, 0, 1, 7]), timeout_ms=rng.randint(0, 60_000),
        topic_data=topics).encode()
    return bytes(encoded)


def _schema(body: bytes, version: int) -> Outcome:
    try:
        decoded = ProduceRequest.decode(memoryview(body), version=version)
    except Exception:
        return "garbage"
    null = first_forbidden_null(ProduceRequest, version, decoded)
    if null is not None:
        return f"null {null}"
    return (decoded.transactional_id, decoded.acks, decoded.timeout_ms,
            [(t.name, [(p.index, p.records) for p in t.partition_data])
             for t in decoded.topic_data])


def _direct(body: bytes, version: int) -> Outcome:
    try:
        decoded: ProduceBody = decode_produce(memoryview(body), version)
    except ForbiddenNull as null:
        return f"null {null.path}"
    except Exception:
        return "garbage"
    assert decoded.version == version
    return (decoded.transactional_id, decoded.acks, decoded.timeout_ms,
            [(t.name, [(p.index, None if p.records is None else bytes(p.records))
                       for p in t.partition_data])
             for t in decoded.topic_data])


@pytest.mark.parametrize("version", range(3, 12))
def test_same_as_the_schema_decoder(version: int) -> None:
    rng = random.Random(version)
    outcomes: set[str] = set()
    for _ in range(300):
        body = _request(rng, version)
        variants = [body, body + rng.randbytes(3), body[:rng.randint(0, len(body))]]
        changed = bytearray(body)
        for _ in range(rng.randint(1, 3)):
            if changed:
                changed[rng.randrange(len(changed))] = rng.choice([0, 1, 0x80, 0xFF, 7])
        variants.append(bytes(changed))
        for variant in variants:
            expected = _schema(variant, version)
            assert _direct(variant, version) == expected, (variant.hex(), expected)
            outcomes.add(expected if isinstance(expected, str) else "decoded")
    assert {"decoded", "garbage"} <= outcomes
    assert any(outcome.startswith("null ") for outcome in outcomes)


def test_records_are_a_view_of_the_frame() -> None:
    body = ProduceRequest(version=9, transactional_id=None, acks=-1, timeout_ms=100,
                          topic_data=[ProduceRequest.TopicProduceData(
                              name="t", partition_data=[
                                  ProduceRequest.TopicProduceData.PartitionProduceData(
                                      index=0, records=b"batch")])]).encode()
    frame = memoryview(bytes(body))
    records = decode_produce(frame, 9).topic_data[0].partition_data[0].records
    assert records is not None and records.obj is frame.obj and bytes(records) == b"batch"
