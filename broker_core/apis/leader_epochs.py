"""OffsetForLeaderEpoch (KIP-320): where a leader epoch ends on a partition's log, which a
consumer asks after its partition moved, to check that its position is still on the log.

A partition has one log whoever owns it (brokers share the storage; a move never
truncates it), so no epoch diverges from it: every epoch ends, for a reader, at the log
end. The answer is the current leader epoch and the log end offset, from which the Java
client, librdkafka and kafka-python conclude "no truncation" and keep their position.
The request checks the caller's leader epoch and DESCRIBE on the topic as ListOffsets does.
"""

from __future__ import annotations

from kafka.protocol.consumer import OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse

from broker_core.context import Operation, RequestContext
from broker_core.engine import Engine
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.storage import DatabaseUnavailable

_Topic = OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult
_Partition = _Topic.EpochEndOffset
_Wanted = OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition


def _end_of_epoch(engine: Engine, ctx: RequestContext, topic: str, part: _Wanted
                  ) -> tuple[int, int]:
    """(leader epoch, end offset) of one requested partition, or KafkaApiError."""
    internal = engine.tenancy.internal_name(ctx, topic)
    if not engine.tenancy.allowed(ctx, Operation.DESCRIBE, internal):
        raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                            f"not allowed to describe {topic}")
    partition = engine.partition(internal, part.partition)
    leadership = engine.leadership.leader_error(internal, part.partition, part.current_leader_epoch)
    if leadership != ErrorCode.NONE:
        raise KafkaApiError(leadership, f"{topic}-{part.partition}")
    epoch = engine.leadership.serves(internal, part.partition)
    if epoch is None:  # given up since the check above
        raise KafkaApiError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{topic}-{part.partition}")
    return epoch, partition.next_offset


async def handle_offset_for_leader_epoch(
        engine: Engine, ctx: RequestContext,
        request: OffsetForLeaderEpochRequest) -> OffsetForLeaderEpochResponse:
    """Answer the end of the requested epoch for every requested partition."""
    await engine.leadership.ready_named(
        ctx, ((t.topic, (p.partition for p in t.partitions)) for t in request.topics))
    topics = []
    for topic in request.topics:
        partitions = []
        for part in topic.partitions:
            code = ErrorCode.NONE
            epoch = end = -1
            try:
                epoch, end = _end_of_epoch(engine, ctx, topic.topic, part)
            except KafkaApiError as error:
                code = error.code
            except DatabaseUnavailable:  # retriable, as Kafka answers a failing log dir
                code = ErrorCode.KAFKA_STORAGE_ERROR
            partitions.append(_Partition(error_code=code, partition=part.partition,
                                         leader_epoch=epoch, end_offset=end))
        topics.append(_Topic(topic=topic.topic, partitions=partitions))
    return OffsetForLeaderEpochResponse(version=request.version, throttle_time_ms=0,
                                        topics=topics)
