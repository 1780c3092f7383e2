"""Replica, leader and log-dir APIs, answered truthfully for a cluster of one broker.

This broker is the only replica and the leader of every partition, and keeps every
partition in one log dir (its data directory). So a preferred or unclean leader
election is never needed (ELECTION_NOT_NEEDED); moving a replica to the log dir it is in
succeeds and any other path is LOG_DIR_NOT_FOUND; a reassignment to this broker alone is
already done, one naming any other broker is INVALID_REPLICA_ASSIGNMENT, and none is ever
in progress. DescribeLogDirs reports each visible partition's size on disk and the file
system's total and usable bytes; while a described partition holds damaged records (a
ledger file cut short or garbled, see ``storage.damage``) the log dir answers
KAFKA_STORAGE_ERROR, Kafka's code for a log dir whose files cannot be read, and still lists
its partitions. The cluster ACLs are Kafka's: ALTER to elect, move or
reassign, DESCRIBE to list log dirs and reassignments.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from kafka.protocol.admin import (
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    AlterReplicaLogDirsRequest,
    AlterReplicaLogDirsResponse,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
)

from broker_core import naming
from broker_core.context import Operation, RequestContext
from broker_core.engine import Engine
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.storage import TopicInfo

_PREFERRED, _UNCLEAN = 0, 1


def _partition_check(engine: Engine, ctx: RequestContext,
                     name: str) -> Callable[[int], ErrorCode]:
    """For topic ``name``, looked up once: a partition index's error, NONE when the caller
    may see that partition and it exists."""
    try:
        _internal, topic = engine.tenancy.named_topic(ctx, name, Operation.DESCRIBE, "describe")
    except KafkaApiError as error:
        code = error.code
        return lambda _index: code
    count = topic.num_partitions
    return lambda index: ErrorCode.NONE if 0 <= index < count \
        else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


# -- ElectLeaders ----------------------------------------------------------------------------

def _all_partitions(engine: Engine, ctx: RequestContext) -> Iterator[tuple[str, list[int]]]:
    for topic in engine.tenancy.visible_topics(ctx):
        yield naming.to_client(topic.name, ctx.home), list(range(topic.num_partitions))


async def handle_elect_leaders(engine: Engine, ctx: RequestContext,
                               request: ElectLeadersRequest) -> ElectLeadersResponse:
    """Answer ElectLeaders: this broker leads every partition already."""
    response = ElectLeadersResponse
    result = response.ReplicaElectionResult
    if not engine.tenancy.cluster_allowed(ctx, Operation.ALTER):
        return response(version=request.version, throttle_time_ms=0,
                        error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                        replica_election_results=[])
    election = request.election_type if request.version >= 1 else _PREFERRED
    wanted = ([(t.topic, list(t.partitions)) for t in request.topic_partitions]
              if request.topic_partitions is not None else list(_all_partitions(engine, ctx)))
    results = []
    for name, partitions in wanted:
        answers = []
        check = _partition_check(engine, ctx, name)
        for index in partitions:
            code = check(index)
            if code == ErrorCode.NONE:
                code = ErrorCode.ELECTION_NOT_NEEDED if election in (_PREFERRED, _UNCLEAN) \
                    else ErrorCode.INVALID_REQUEST
            message = {ErrorCode.ELECTION_NOT_NEEDED: "this broker is the only replica and "
                                                      "already the leader",
                       ErrorCode.INVALID_REQUEST: f"unknown election type {election}"}.get(code)
            answers.append(result.PartitionResult(partition_id=index, error_code=code,
                                                  error_message=message))
        results.append(result(topic=name, partition_result=answers))
    return response(version=request.version, throttle_time_ms=0, error_code=0,
                    replica_election_results=results)


# -- DescribeLogDirs and AlterReplicaLogDirs -------------------------------------------------

def _described_topics(engine: Engine, ctx: RequestContext,
                      request: DescribeLogDirsRequest
                      ) -> list[tuple[str, TopicInfo, list[int]]]:
    """(client name, topic, partitions) of what the request asks for and the caller sees."""
    if request.topics is None:
        return [(naming.to_client(t.name, ctx.home), t, list(range(t.num_partitions)))
                for t in engine.tenancy.visible_topics(ctx)]
    found = []
    for wanted in request.topics:
        try:
            _internal, topic = engine.tenancy.named_topic(ctx, wanted.topic, Operation.DESCRIBE,
                                                  "describe")
        except KafkaApiError:
            continue  # as Kafka: what cannot be described is left out
        found.append((wanted.topic, topic,
                      [p for p in wanted.partitions if 0 <= p < topic.num_partitions]))
    return found


async def handle_describe_log_dirs(engine: Engine, ctx: RequestContext,
                                   request: DescribeLogDirsRequest) -> DescribeLogDirsResponse:
    """Answer DescribeLogDirs: one log dir, the data directory, with partition sizes."""
    response = DescribeLogDirsResponse
    if not engine.tenancy.cluster_allowed(ctx, Operation.DESCRIBE):
        return response(version=request.version, throttle_time_ms=0,
                        error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, results=[])
    result = response.DescribeLogDirsResult
    topics = []
    damaged = False
    for name, topic, indexes in _described_topics(engine, ctx, request):
        partitions = []
        for index in indexes:
            log = engine.logs.partition(topic.name, index)
            if log is not None:
                damaged = damaged or bool(log.damaged_ranges())
                partitions.append(result.DescribeLogDirsTopic.DescribeLogDirsPartition(
                    partition_index=index, partition_size=log.size_bytes, offset_lag=0,
                    is_future_key=False))
        topics.append(result.DescribeLogDirsTopic(name=name, partitions=partitions))
    disk = engine.logs.disk_usage()
    return response(version=request.version, throttle_time_ms=0, error_code=0, results=[
        result(error_code=ErrorCode.KAFKA_STORAGE_ERROR if damaged else 0,
               log_dir=engine.logs.location, topics=topics,
               total_bytes=disk.total_bytes, usable_bytes=disk.usable_bytes,
               is_cordoned=False)])


async def handle_alter_replica_log_dirs(
        engine: Engine, ctx: RequestContext,
        request: AlterReplicaLogDirsRequest) -> AlterReplicaLogDirsResponse:
    """Answer AlterReplicaLogDirs: every replica already is in the one log dir."""
    response = AlterReplicaLogDirsResponse
    allowed = engine.tenancy.cluster_allowed(ctx, Operation.ALTER)
    results = []
    for target in request.dirs:
        for wanted in target.topics:
            answers = []
            check = _partition_check(engine, ctx, wanted.name)
            for index in wanted.partitions:
                if not allowed:
                    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
                else:
                    code = check(index)
                    if code == ErrorCode.NONE and not engine.logs.names_location(target.path):
                        code = ErrorCode.LOG_DIR_NOT_FOUND
                answers.append(response.AlterReplicaLogDirTopicResult
                               .AlterReplicaLogDirPartitionResult(partition_index=index,
                                                                  error_code=code))
            results.append(response.AlterReplicaLogDirTopicResult(topic_name=wanted.name,
                                                                  partitions=answers))
    return response(version=request.version, throttle_time_ms=0, results=results)


# -- partition reassignments -----------------------------------------------------------------

_Reassignable = AlterPartitionReassignmentsRequest.ReassignableTopic.ReassignablePartition


def _reassignment_error(engine: Engine, code: ErrorCode,
                        wanted: _Reassignable) -> tuple[ErrorCode, str | None]:
    if code != ErrorCode.NONE:
        return code, None
    if wanted.replicas is None:
        return ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, "no reassignment is in progress"
    if list(wanted.replicas) != [engine.config.broker_id]:
        return (ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"broker {engine.config.broker_id} is the only broker and holds the only "
                f"replica; cannot assign {list(wanted.replicas)}")
    return ErrorCode.NONE, None


async def handle_alter_partition_reassignments(
        engine: Engine, ctx: RequestContext,
        request: AlterPartitionReassignmentsRequest) -> AlterPartitionReassignmentsResponse:
    """Answer AlterPartitionReassignments: only this broker can hold a replica."""
    response = AlterPartitionReassignmentsResponse
    topic_result = response.ReassignableTopicResponse

    def answer(code: int, message: str | None,
               results: list[AlterPartitionReassignmentsResponse.ReassignableTopicResponse]
               ) -> AlterPartitionReassignmentsResponse:
        return response(version=request.version, throttle_time_ms=0,
                        allow_replication_factor_change=True, error_code=code,
                        error_message=message, responses=results)

    if not engine.tenancy.cluster_allowed(ctx, Operation.ALTER):
        return answer(ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                      "not allowed to alter the cluster", [])
    results = []
    for wanted in request.topics:
        answers = []
        check = _partition_check(engine, ctx, wanted.name)
        for partition in wanted.partitions:
            code, message = _reassignment_error(engine, check(partition.partition_index),
                                                partition)
            answers.append(topic_result.ReassignablePartitionResponse(
                partition_index=partition.partition_index, error_code=code,
                error_message=message))
        results.append(topic_result(name=wanted.name, partitions=answers))
    return answer(0, None, results)


async def handle_list_partition_reassignments(
        engine: Engine, ctx: RequestContext,
        request: ListPartitionReassignmentsRequest) -> ListPartitionReassignmentsResponse:
    """Answer ListPartitionReassignments: none is ever in progress."""
    allowed = engine.tenancy.cluster_allowed(ctx, Operation.DESCRIBE)
    return ListPartitionReassignmentsResponse(
        version=request.version, throttle_time_ms=0,
        error_code=0 if allowed else ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
        error_message=None if allowed else "not allowed to describe the cluster", topics=[])
