"""The hand-written Metadata topics match kafka.protocol's encoding byte for byte."""

from __future__ import annotations

import uuid

import pytest
from kafka.protocol.metadata import MetadataResponse

from broker_core.codec.framing import Prewritten
from broker_core.codec.metadata_writer import MAX_VERSION, MetadataAnswer, TopicMetadata

_R = MetadataResponse
_Topic = _R.MetadataResponseTopic
_Partition = _Topic.MetadataResponsePartition


def _topics(version: int) -> list[TopicMetadata]:
    many = [(0, i, 0, 3, (0,)) for i in range(300)]
    mixed = [(0, 0, 2, 7, (2,)), (5, 1, -1, -1, ()), (0, 2, 1, 2**31 - 1, (1, 0, 2))]
    topics = [
        TopicMetadata(0, "orders", uuid.uuid4(), False, many, {0, 2, 30} if version >= 8
                      else None),
        TopicMetadata(0, "tenant/ns/ünïcode", uuid.uuid4(), True, mixed),
        TopicMetadata(3, "missing", uuid.UUID(int=0), False),
        TopicMetadata(0, "x" * 300, uuid.uuid4(), False, [(0, 0, 0, 0, (0,))], set()),
    ]
    if version >= 12:  # a topic asked for by an unknown id: no name
        topics.append(TopicMetadata(100, None, uuid.uuid4(), False))
        topics.append(TopicMetadata(100, None, None, False))
    return topics


def _head(version: int) -> MetadataResponse:
    return _R(version=version, throttle_time_ms=17, brokers=[
        _R.MetadataResponseBroker(node_id=0, host="127.0.0.1", port=9092, rack=None),
        _R.MetadataResponseBroker(node_id=1, host="b1.example", port=19092, rack="r1")],
        cluster_id="cluster-ä", controller_id=1, topics=[],
        authorized_operations=None if version % 2 else {1, 3}, error_code=0)


def _library(version: int, topics: list[TopicMetadata]) -> bytes:
    head = _head(version)
    head.topics = [_Topic(
        error_code=t.error_code, name=t.name, topic_id=t.topic_id, is_internal=t.is_internal,
        partitions=[_Partition(error_code=e, partition_index=i, leader_id=leader,
                               leader_epoch=epoch, replica_nodes=list(nodes),
                               isr_nodes=list(nodes), offline_replicas=[])
                    for e, i, leader, epoch, nodes in t.partitions],
        authorized_operations=t.authorized_operations) for t in topics]
    return bytes(head.encode())


def _ours(answer: Prewritten) -> bytes:
    parts, size = answer.encode_parts()
    joined = b"".join(bytes(part) for part in parts)  # type: ignore[arg-type]
    assert len(joined) == size
    return joined


@pytest.mark.parametrize("version", range(MAX_VERSION + 1))
def test_every_version_matches_the_schema_library(version: int) -> None:
    topics = _topics(version)
    assert _ours(MetadataAnswer(_head(version), topics)) == _library(version, topics)


@pytest.mark.parametrize("version", [0, 8, 9, 12])
def test_no_topics_and_a_throttle_set_later(version: int) -> None:
    answer = MetadataAnswer(_head(version), [])
    answer.throttle_time_ms = 250
    expected = _head(version)
    expected.throttle_time_ms = 250
    assert _ours(answer) == bytes(expected.encode())
    assert answer.throttle_time_ms == 250


def test_a_head_with_topics_is_refused() -> None:
    head = _head(12)
    head.topics = [_Topic(error_code=3, name="t", topic_id=uuid.UUID(int=0),
                          is_internal=False, partitions=[], authorized_operations=None)]
    with pytest.raises(ValueError):
        MetadataAnswer(head, []).encode_parts()
