"""The Produce response written directly (``broker_core.codec.produce_writer``) is byte
for byte what the schema library encodes, at every version served, for successes,
errors with and without a message, names of any length and throttle times."""

from __future__ import annotations

import random

import pytest
from kafka.protocol.producer import ProduceResponse

from broker_core.codec.produce_writer import PartitionAnswer, ProduceAnswer

_Topic = ProduceResponse.TopicProduceResponse
_Partition = _Topic.PartitionProduceResponse


def _answers(rng: random.Random) -> list[tuple[str, list[PartitionAnswer]]]:
    topics = []
    for number in range(rng.randint(0, 4)):
        name = f"t{number}-" + "x" * rng.choice([0, 5, 130, 300]) + "é"
        partitions = []
        for index in range(rng.randint(0, 5)):
            failed = rng.random() < 0.4
            partitions.append(PartitionAnswer(
                index, rng.choice([6, 10, 87]) if failed else 0,
                -1 if failed else rng.randint(0, 2 ** 40),
                -1 if failed or rng.random() < 0.5 else rng.randint(0, 2 ** 41),
                -1 if failed else rng.randint(0, 2 ** 30),
                rng.choice([None, "", "not the leader", "ü" * 200]) if failed else None))
        topics.append((name, partitions))
    return topics


def _schema_encoded(version: int, topics: list[tuple[str, list[PartitionAnswer]]],
                    throttle_ms: int) -> bytes:
    encoded = ProduceResponse(version=version, throttle_time_ms=throttle_ms, responses=[
        _Topic(name=name, partition_responses=[
            _Partition(index=p.partition, error_code=p.error_code, base_offset=p.base_offset,
                       log_append_time_ms=p.log_append_time_ms,
                       log_start_offset=p.log_start_offset, record_errors=[],
                       error_message=p.error_message)
            for p in partitions])
        for name, partitions in topics]).encode()
    return bytes(encoded)


@pytest.mark.parametrize("version", range(3, 12))
def test_same_bytes_as_the_schema_encoder(version: int) -> None:
    rng = random.Random(version)
    for _ in range(40):
        topics = _answers(rng)
        throttle_ms = rng.choice([0, 0, 250, 30_000])
        answer = ProduceAnswer(version, topics)
        answer.throttle_time_ms = throttle_ms
        parts, size = answer.encode_parts()
        body = b"".join(bytes(part) for part in parts if isinstance(part, bytes | memoryview))
        assert size == len(body)
        assert body == _schema_encoded(version, topics, throttle_ms)
        decoded = ProduceResponse[version].decode(body)
        assert [t.name for t in decoded.responses] == [name for name, _ in topics]
