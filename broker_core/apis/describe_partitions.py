"""DescribeTopicPartitions (KIP-966): the partitions of named or of all visible topics, in
pages of at most ``response_partition_limit`` partitions (and never more than 2,000, the
default of Kafka's ``max.request.partition.size.limit``), resumed from a cursor.

Topics come sorted by name, as the cursor (topic name, first partition) assumes. A named
topic the caller may not describe answers TOPIC_AUTHORIZATION_FAILED, a missing one
UNKNOWN_TOPIC_OR_PARTITION; this broker leads every partition and is its only replica.
Like Kafka without eligible leader replicas, the ELR lists are empty, never null (the Java
client reads them without a null check).
"""

from __future__ import annotations

import uuid

from kafka.protocol.admin import DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse

from broker_core import naming
from broker_core.apis.authorized_operations import authorized_operations, bitfield
from broker_core.apis.metadata import leadership
from broker_core.context import Operation, RequestContext, ResourceType
from broker_core.engine import Engine
from broker_core.errors import KafkaApiError
from broker_core.storage import TopicInfo

_Topic = DescribeTopicPartitionsResponse.DescribeTopicPartitionsResponseTopic
_Partition = _Topic.DescribeTopicPartitionsResponsePartition
_NO_TOPIC_ID = uuid.UUID(int=0)
_NOT_REQUESTED = -(2**31)
MAX_PARTITIONS_PER_RESPONSE = 2000


def _wanted(engine: Engine, ctx: RequestContext,
            request: DescribeTopicPartitionsRequest
            ) -> list[tuple[str, TopicInfo | None, int]]:
    """(name shown, topic or None, error code), sorted by the name shown."""
    if not request.topics:
        return [(naming.to_client(t.name, ctx.home), t, 0)
                for t in engine.tenancy.visible_topics(ctx)]
    found: list[tuple[str, TopicInfo | None, int]] = []
    for name in sorted({wanted.name for wanted in request.topics}):
        try:
            _internal, topic = engine.tenancy.named_topic(ctx, name, Operation.DESCRIBE, "describe")
        except KafkaApiError as error:
            found.append((name, None, error.code))
            continue
        found.append((name, topic, 0))
    return found


def _operations(engine: Engine, ctx: RequestContext, topic: TopicInfo) -> int:
    return bitfield(authorized_operations(engine, ctx, ResourceType.TOPIC, topic.name))


async def handle_describe_topic_partitions(
        engine: Engine, ctx: RequestContext,
        request: DescribeTopicPartitionsRequest) -> DescribeTopicPartitionsResponse:
    """Answer DescribeTopicPartitions, one page of partitions."""
    budget = min(max(1, request.response_partition_limit), MAX_PARTITIONS_PER_RESPONSE)
    cursor = request.cursor
    topics, next_cursor = [], None
    for name, topic, code in _wanted(engine, ctx, request):
        if cursor is not None and name < cursor.topic_name:
            continue
        first = max(cursor.partition_index, 0) \
            if cursor is not None and name == cursor.topic_name else 0
        if topic is None:
            topics.append(_Topic(error_code=code, name=name, topic_id=_NO_TOPIC_ID,
                                 is_internal=False, partitions=[],
                                 topic_authorized_operations=_NOT_REQUESTED))
            continue
        if budget == 0:
            next_cursor = DescribeTopicPartitionsResponse.Cursor(topic_name=name,
                                                                 partition_index=first)
            break
        last = min(topic.num_partitions, first + budget)
        partitions = [_Partition(**leadership(engine, topic, index),
                                 eligible_leader_replicas=[], last_known_elr=[])
                      for index in range(first, last)]
        budget -= len(partitions)
        topics.append(_Topic(error_code=0, name=name, topic_id=topic.topic_id,
                             is_internal=engine.tenancy.is_internal(topic.name),
                             partitions=partitions,
                             topic_authorized_operations=_operations(engine, ctx, topic)))
        if last < topic.num_partitions:
            next_cursor = DescribeTopicPartitionsResponse.Cursor(topic_name=name,
                                                                 partition_index=last)
            break
    return DescribeTopicPartitionsResponse(version=request.version, throttle_time_ms=0,
                                           topics=topics, next_cursor=next_cursor)
