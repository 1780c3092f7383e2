"""Replica, leader and log-dir APIs, answered truthfully for brokers that each hold one
replica per partition (``replica_placement``).

A partition's only replica is its leader, on the broker the cluster's ownership function
names (Metadata's leader; on a single broker, that broker). So a preferred or unclean
leader election is never needed (ELECTION_NOT_NEEDED); a reassignment to exactly that
broker is already done, any other is INVALID_REPLICA_ASSIGNMENT naming it (ownership
follows placement, not requests), and none is ever in progress. A broker keeps its
partitions in one log dir (its storage's location): DescribeLogDirs lists the partitions
this broker holds now, as Kafka lists a broker's hosted replicas, each with its size, and
the file system's total and usable bytes (a tenant's login is shown a log dir that names
nothing of the storage, with unknown (-1) sizes: ``Tenancy.log_dir``); moving a replica
held here to the log dir the caller is shown succeeds, any other path is
LOG_DIR_NOT_FOUND, and a replica this broker does not hold is
NOT_LEADER_OR_FOLLOWER, as Kafka answers. While a described partition holds damaged
records (a ledger file cut short or garbled, see ``storage.damage``) the log dir answers
KAFKA_STORAGE_ERROR, Kafka's code for a log dir whose files cannot be read, and still lists
its partitions. The cluster ACLs are Kafka's: ALTER to elect, move or reassign, DESCRIBE to
list log dirs and reassignments.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

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
from broker_core.apis.replica_placement import assignment_error, hosted_here
from broker_core.context import Operation, RequestContext
from broker_core.engine import Engine
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.storage import TopicInfo

_PREFERRED, _UNCLEAN = 0, 1


@dataclass(frozen=True, slots=True)
class _Named:
    """A topic a request names, looked up once: the topic, or the error of every one of its
    partitions (the caller may not see it, or it does not exist)."""

    name: str
    """As the caller knows it."""
    topic: TopicInfo | None
    error: ErrorCode

    def check(self, index: int) -> ErrorCode:
        """A partition index's error, NONE when the caller may see it and it exists."""
        if self.topic is None:
            return self.error
        return ErrorCode.NONE if 0 <= index < self.topic.num_partitions \
            else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    def here(self, engine: Engine, index: int) -> bool:
        """Whether this broker holds the replica of a partition :meth:`check` passed."""
        assert self.topic is not None
        return hosted_here(engine, self.topic.name, index, self.topic.num_partitions)


def _named(engine: Engine, ctx: RequestContext, name: str) -> _Named:
    try:
        _internal, topic = engine.tenancy.named_topic(ctx, name, Operation.DESCRIBE, "describe")
    except KafkaApiError as error:
        return _Named(name, None, error.code)
    return _Named(name, topic, ErrorCode.NONE)


# -- ElectLeaders ----------------------------------------------------------------------------

def _all_partitions(engine: Engine, ctx: RequestContext) -> Iterator[tuple[str, list[int]]]:
    for topic in engine.tenancy.visible_topics(ctx):
        yield naming.to_client(topic.name, ctx.home), list(range(topic.num_partitions))


async def handle_elect_leaders(engine: Engine, ctx: RequestContext,
                               request: ElectLeadersRequest) -> ElectLeadersResponse:
    """Answer ElectLeaders: every partition's only replica leads it already."""
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
        named = _named(engine, ctx, name)
        for index in partitions:
            code = named.check(index)
            if code == ErrorCode.NONE:
                code = ErrorCode.ELECTION_NOT_NEEDED if election in (_PREFERRED, _UNCLEAN) \
                    else ErrorCode.INVALID_REQUEST
            message = {ErrorCode.ELECTION_NOT_NEEDED: "the partition's only replica is its "
                                                      "leader already",
                       ErrorCode.INVALID_REQUEST: f"unknown election type {election}"}.get(code)
            if code == ErrorCode.ELECTION_NOT_NEEDED and request.topic_partitions is None:
                continue  # as Kafka: electing every partition lists only those it changed
            answers.append(result.PartitionResult(partition_id=index, error_code=code,
                                                  error_message=message))
        results.append(result(topic=name, partition_result=answers))
    return response(version=request.version, throttle_time_ms=0, error_code=0,
                    replica_election_results=results)


# -- DescribeLogDirs and AlterReplicaLogDirs -------------------------------------------------

def _described_topics(engine: Engine, ctx: RequestContext,
                      request: DescribeLogDirsRequest
                      ) -> list[tuple[str, TopicInfo, list[int]]]:
    """(client name, topic, partitions) of what the request asks for, the caller sees and
    this broker holds now; as Kafka, a topic with none of them here is left out."""
    asked: list[tuple[str, TopicInfo, Iterable[int]]]
    if request.topics is None:
        asked = [(naming.to_client(t.name, ctx.home), t, range(t.num_partitions))
                 for t in engine.tenancy.visible_topics(ctx)]
    else:
        asked = []
        for wanted in request.topics:
            named = _named(engine, ctx, wanted.topic)
            if named.topic is not None:  # as Kafka: what cannot be described is left out
                asked.append((wanted.topic, named.topic,
                              [p for p in wanted.partitions if named.check(p) == ErrorCode.NONE]))
    found = []
    for name, topic, indexes in asked:
        here = [index for index in indexes
                if hosted_here(engine, topic.name, index, topic.num_partitions)]
        if here:
            found.append((name, topic, here))
    return found


async def handle_describe_log_dirs(engine: Engine, ctx: RequestContext,
                                   request: DescribeLogDirsRequest) -> DescribeLogDirsResponse:
    """Answer DescribeLogDirs: one log dir, with the sizes of the partitions held here."""
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
    disk = engine.tenancy.disk_usage(ctx)
    return response(version=request.version, throttle_time_ms=0, error_code=0, results=[
        result(error_code=ErrorCode.KAFKA_STORAGE_ERROR if damaged else 0,
               log_dir=engine.tenancy.log_dir(ctx), topics=topics,
               total_bytes=disk.total_bytes, usable_bytes=disk.usable_bytes,
               is_cordoned=False)])


async def handle_alter_replica_log_dirs(
        engine: Engine, ctx: RequestContext,
        request: AlterReplicaLogDirsRequest) -> AlterReplicaLogDirsResponse:
    """Answer AlterReplicaLogDirs: every replica held here already is in the one log dir."""
    response = AlterReplicaLogDirsResponse
    allowed = engine.tenancy.cluster_allowed(ctx, Operation.ALTER)
    results = []
    for target in request.dirs:
        for wanted in target.topics:
            answers = []
            named = _named(engine, ctx, wanted.name)
            for index in wanted.partitions:
                if not allowed:
                    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
                else:
                    code = named.check(index)
                    if code == ErrorCode.NONE and \
                            not engine.tenancy.names_log_dir(ctx, target.path):
                        code = ErrorCode.LOG_DIR_NOT_FOUND
                    elif code == ErrorCode.NONE and not named.here(engine, index):
                        code = ErrorCode.NOT_LEADER_OR_FOLLOWER  # another broker holds it
                answers.append(response.AlterReplicaLogDirTopicResult
                               .AlterReplicaLogDirPartitionResult(partition_index=index,
                                                                  error_code=code))
            results.append(response.AlterReplicaLogDirTopicResult(topic_name=wanted.name,
                                                                  partitions=answers))
    return response(version=request.version, throttle_time_ms=0, results=results)


# -- partition reassignments -----------------------------------------------------------------

_Reassignable = AlterPartitionReassignmentsRequest.ReassignableTopic.ReassignablePartition


def _reassignment_error(engine: Engine, named: _Named,
                        wanted: _Reassignable) -> tuple[ErrorCode, str | None]:
    """A partition's answer: none in progress to cancel; done when ``wanted`` names the
    broker holding its replica, else INVALID_REPLICA_ASSIGNMENT naming that broker."""
    index = wanted.partition_index
    code = named.check(index)
    if code != ErrorCode.NONE:
        return code, None
    if wanted.replicas is None:
        return ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, "no reassignment is in progress"
    assert named.topic is not None
    error = assignment_error(engine, named.topic.name, named.name, index,
                             named.topic.num_partitions, wanted.replicas)
    return (ErrorCode.NONE, None) if error is None else (error.code, error.message)


async def handle_alter_partition_reassignments(
        engine: Engine, ctx: RequestContext,
        request: AlterPartitionReassignmentsRequest) -> AlterPartitionReassignmentsResponse:
    """Answer AlterPartitionReassignments: a partition's one replica stays where it is."""
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
        named = _named(engine, ctx, wanted.name)
        for partition in wanted.partitions:
            code, message = _reassignment_error(engine, named, partition)
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
