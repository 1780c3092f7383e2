"""DeleteRecords: move a partition's log start offset forward (not in a topic whose
``cleanup.policy`` lacks ``delete``: POLICY_VIOLATION, as Kafka)."""

from __future__ import annotations

import asyncio
import logging

from kafka.protocol.admin import DeleteRecordsRequest, DeleteRecordsResponse

from broker_core.context import Operation, RequestContext
from broker_core.engine import Engine
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.storage import OffsetOutOfRange
from broker_core.storage.cluster import NotOwner
from broker_core.storage_faults import WriteKind
from broker_core.topic_configs import list_items
from common.log_fields import topic_fields

log = logging.getLogger(__name__)
_Topic = DeleteRecordsResponse.DeleteRecordsTopicResult
_Partition = _Topic.DeleteRecordsPartitionResult
HIGH_WATERMARK = -1


async def _delete_before(engine: Engine, ctx: RequestContext, name: str, index: int,
                         offset: int) -> int:
    internal = engine.tenancy.internal_name(ctx, name)
    engine.tenancy.check_writable(internal)
    if not engine.tenancy.allowed(ctx, Operation.DELETE, internal):
        raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                            f"not allowed to delete records of {name}")
    partition = engine.partition(internal, index)
    topic = engine.logs.topic(internal)
    policy = engine.topic_configs(topic.configs if topic is not None else {})["cleanup.policy"]
    if "delete" not in list_items(policy):  # as Kafka: a compacted topic's log is kept
        raise KafkaApiError(ErrorCode.POLICY_VIOLATION,
                            f"records of {name}-{index} can not be deleted: its "
                            f"cleanup.policy is {policy}")
    high_watermark = engine.flusher.high_watermark(partition)
    if offset == HIGH_WATERMARK:
        offset = high_watermark
    if offset < 0 or offset > high_watermark:
        raise KafkaApiError(ErrorCode.OFFSET_OUT_OF_RANGE,
                            f"offset {offset} is beyond the high watermark {high_watermark}")
    try:
        with engine.faults.guard(f"the log start of {internal}-{index}", WriteKind.LOG_START):
            if partition.drops_in_thread:  # a blocking transaction (PostgreSQL)
                low = await asyncio.to_thread(partition.delete_records_before, offset)
            else:  # on the loop, where reads walk the log
                low = partition.delete_records_before(offset)
    except OffsetOutOfRange as exc:
        raise KafkaApiError(ErrorCode.OFFSET_OUT_OF_RANGE, str(exc)) from exc
    except NotOwner as exc:  # another broker took the partition meanwhile
        raise KafkaApiError(ErrorCode.NOT_LEADER_OR_FOLLOWER, str(exc)) from exc
    log.info("log start offset of %s-%d is now %d", internal, index, low,
             extra=topic_fields(internal, **ctx.who()))
    return low


async def handle_delete_records(engine: Engine, ctx: RequestContext,
                                request: DeleteRecordsRequest) -> DeleteRecordsResponse:
    """Answer DeleteRecords with each partition's new low watermark."""
    await engine.leadership.ready_named(
        ctx, ((t.name, (p.partition_index for p in t.partitions)) for t in request.topics))
    topics = []
    for topic in request.topics:
        partitions = []
        for part in topic.partitions:
            code, low = ErrorCode.NONE, -1
            try:
                low = await _delete_before(engine, ctx, topic.name, part.partition_index,
                                           part.offset)
            except KafkaApiError as error:
                engine.refusals.refused(ctx, f"partition {part.partition_index} of topic",
                                        topic.name, error)
                code = error.code
            partitions.append(_Partition(partition_index=part.partition_index,
                                         low_watermark=low, error_code=code))
        topics.append(_Topic(name=topic.name, partitions=partitions))
    return DeleteRecordsResponse(version=request.version, throttle_time_ms=0, topics=topics)
