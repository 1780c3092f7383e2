"""The Produce request read directly (``broker_core.codec.produce_reader``) gives what the
schema library's decoder gives, and refuses what it refuses (with the forbidden null
:mod:`broker_core.null_fields` names), at every version served: for requests it encodes,
and for those requests cut short, with bytes changed, or with a null where none may be."""

from __future__ import annotations

import random
import struct
import tracemalloc

import pytest
from kafka.protocol.producer import ProduceRequest

from broker_core.codec.errors import ProtocolError
from broker_core.codec.produce_reader import ForbiddenNull, ProduceBody, decode_produce
from broker_core.codec.varints import uvarint
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


def _body(version: int, transactional_id: str | None = None) -> bytes:
    return bytes(ProduceRequest(
        version=version, transactional_id=transactional_id, acks=-1, timeout_ms=100,
        topic_data=[ProduceRequest.TopicProduceData(name="t", partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(
                index=0, records=b"batch")])]).encode())


def test_an_unsigned_varint_over_5_bytes_is_garbage() -> None:
    """Kafka's ``readUnsignedVarint`` takes 5 bytes at most: a longer one (an overlong
    encoding of a small length, or a run of 0xFF bytes that would cost time quadratic in
    its length) is refused at its 6th byte."""
    body = _body(9, "")
    assert body[0] == 0x01  # the empty transactional id's compact length
    five = b"\x81\x80\x80\x80\x00" + body[1:]  # the same length, overlong within 5 bytes
    assert decode_produce(memoryview(five), 9).transactional_id == ""
    with pytest.raises(ProtocolError, match="varint too long"):
        decode_produce(memoryview(b"\x81\x80\x80\x80\x80\x00" + body[1:]), 9)
    with pytest.raises(ProtocolError, match="varint too long"):
        decode_produce(memoryview(b"\xff" * 100_000 + b"\x01"), 9)


@pytest.mark.parametrize("version", [8, 9])
@pytest.mark.parametrize("level", ["topics", "partitions"])
def test_a_count_past_the_bytes_left_is_garbage_before_any_entry_is_built(
        version: int, level: str) -> None:
    """A count of entries that cannot fit in the bytes left (each takes at least its fixed
    fields) is refused when read, as Kafka's generated readers refuse it: no entry is built
    (counted by the memory the reading takes: the entries that are there would take
    megabytes)."""
    flexible = version >= 9
    entries = 100_000
    partition = struct.pack(">i", 0) + (b"\x00\x00" if flexible else struct.pack(">i", -1))
    topic = (b"\x02t\x01\x00" if flexible else struct.pack(">h", 1) + b"t" + struct.pack(">i", 0))

    def count(n: int) -> bytes:
        return uvarint(n + 1) if flexible else struct.pack(">i", n)

    head = (b"\x00" if flexible else struct.pack(">h", -1)) + struct.pack(">hi", -1, 100)
    if level == "topics":
        body = head + count(2**31 - 2) + topic * entries
    else:
        body = head + count(1) + (b"\x02t" if flexible else struct.pack(">h", 1) + b"t") + \
            count(2**31 - 2) + partition * entries
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="entries in"):
            decode_produce(memoryview(body), version)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024, peak
