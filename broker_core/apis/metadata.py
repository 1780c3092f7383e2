"""Metadata and DescribeCluster: the live brokers as advertised on the caller's listener,
and topics with each partition's leader from the one ownership function."""

from __future__ import annotations

import uuid
from typing import TypedDict

from kafka.protocol.admin import DescribeClusterRequest, DescribeClusterResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from broker_core import naming
from broker_core.apis.authorized_operations import authorized_operations
from broker_core.codec.metadata_writer import MetadataAnswer, Partition, TopicMetadata
from broker_core.context import Operation, RequestContext, ResourceType
from broker_core.engine import Engine
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.quotas.limits import TopicCounts
from broker_core.storage import TopicInfo
from broker_core.tenancy import CLUSTER_NAME
from broker_core.topic_ids import TopicsById

_R = MetadataResponse
_NO_TOPIC_ID = uuid.UUID(int=0)


class Leadership(TypedDict):
    """A partition's leader fields, as Metadata and DescribeTopicPartitions name them."""

    error_code: int
    partition_index: int
    leader_id: int
    leader_epoch: int
    replica_nodes: list[int]
    isr_nodes: list[int]
    offline_replicas: list[int]


_OK = int(ErrorCode.NONE)
_UNAVAILABLE = int(ErrorCode.LEADER_NOT_AVAILABLE)
_ALONE = {0: (0,)}
"""The replica nodes of a partition led by broker 0, 1, ... (one tuple each, shared)."""


def partition_leader(engine: Engine, topic: TopicInfo, index: int) -> Partition:
    """A partition's leader from the one ownership function, as (error code, index,
    leader id, leader epoch, replica nodes): LEADER_NOT_AVAILABLE while no live broker
    can take it."""
    leader = engine.cluster.leader(topic.name, index, topic.num_partitions)
    if leader is None:
        return (_UNAVAILABLE, index, -1, -1, ())
    broker = leader.broker_id
    nodes = _ALONE.get(broker)
    if nodes is None:
        nodes = _ALONE.setdefault(broker, (broker,))
    return (_OK, index, broker, leader.epoch, nodes)


def leadership(engine: Engine, topic: TopicInfo, index: int) -> Leadership:
    """A partition's leader fields, as Metadata and DescribeTopicPartitions give them
    (:func:`partition_leader`)."""
    error, _, leader_id, epoch, nodes = partition_leader(engine, topic, index)
    return {"error_code": error, "partition_index": index, "leader_id": leader_id,
            "leader_epoch": epoch, "replica_nodes": list(nodes), "isr_nodes": list(nodes),
            "offline_replicas": []}


def _topic_entry(engine: Engine, ctx: RequestContext, shown: str, topic: TopicInfo,
                 version: int, with_operations: bool) -> TopicMetadata:
    partitions = [partition_leader(engine, topic, index)
                  for index in range(topic.num_partitions)]
    operations = (
        authorized_operations(engine, ctx, ResourceType.TOPIC, topic.name)
        if with_operations and version >= 8 else None
    )
    return TopicMetadata(
        error_code=0, name=shown, topic_id=topic.topic_id,
        is_internal=engine.tenancy.is_internal(topic.name),
        partitions=partitions, authorized_operations=operations,
    )


def _error_entry(name: str | None, code: ErrorCode,
                 topic_id: uuid.UUID | None = _NO_TOPIC_ID) -> TopicMetadata:
    return TopicMetadata(error_code=code, name=name, topic_id=topic_id, is_internal=False)


def _requested_topic(engine: Engine, ctx: RequestContext,
                     requested: MetadataRequest.MetadataRequestTopic, version: int,
                     auto_create: bool, with_operations: bool,
                     by_id: TopicsById, counts: TopicCounts | None) -> TopicMetadata:
    name = requested.name
    topic_id = requested.topic_id if version >= 10 else None
    if name is None or (not name and topic_id not in (None, _NO_TOPIC_ID)):
        # by id (the Java client sends an empty name beside the id; Kafka ignores it)
        found = by_id.get(topic_id)
        if found is None:
            return _error_entry(None, ErrorCode.UNKNOWN_TOPIC_ID, topic_id)
        if not engine.tenancy.allowed(ctx, Operation.DESCRIBE, found.name):
            # As Kafka: an id is not secret, so an existing one the caller may not describe
            # answers the authorization error, with the name withheld.
            return _error_entry(None, ErrorCode.TOPIC_AUTHORIZATION_FAILED, topic_id)
        shown = naming.to_client(found.name, ctx.home)
        return _topic_entry(engine, ctx, shown, found, version, with_operations)
    try:
        internal = engine.tenancy.internal_name(ctx, name)
    except KafkaApiError as error:
        return _error_entry(name, error.code)
    if not engine.tenancy.allowed(ctx, Operation.DESCRIBE, internal):
        return _error_entry(name, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
    creatable = auto_create and not engine.tenancy.is_internal(internal) \
        and engine.tenancy.allowed(ctx, Operation.CREATE, internal)  # the broker's are its own
    topic = engine.lookup(internal, creatable, counts)
    if topic is None:
        return _error_entry(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    return _topic_entry(engine, ctx, name, topic, version, with_operations)


async def handle_metadata(engine: Engine, ctx: RequestContext,
                          request: MetadataRequest) -> MetadataAnswer:
    """Answer Metadata for the named topics, or for every topic of the caller's namespace
    (the topics written by hand: :mod:`broker_core.codec.metadata_writer`)."""
    version = request.version
    with_operations = bool(request.include_topic_authorized_operations)
    auto_create = version < 4 or bool(request.allow_auto_topic_creation)
    if request.topics is None or (version == 0 and not request.topics):
        topics = [
            _topic_entry(engine, ctx, naming.to_client(topic.name, ctx.home), topic, version,
                         with_operations)
            for topic in engine.tenancy.visible_topics(ctx)
        ]
    else:
        by_id = TopicsById(engine.logs)
        named = request.topics

        def answer(create: bool) -> list[TopicMetadata]:
            counts = engine.limits.topic_counts() if create and engine.limits else None
            return [_requested_topic(engine, ctx, requested, version, create,
                                     with_operations, by_id, counts)
                    for requested in named]

        topics = answer(False)
        if auto_create and engine.config.allow_auto_topic_creation and any(
                topic.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION for topic in topics):
            # created as CreateTopics creates, one request at a time: the tenant's caps
            # count the topics a CreateTopics is still creating in a worker thread
            async with engine.topic_changes:
                topics = answer(True)
    cluster_operations = (
        authorized_operations(engine, ctx, ResourceType.CLUSTER, CLUSTER_NAME)
        if version >= 8 and request.include_cluster_authorized_operations else None
    )
    head = _R(
        version=version, throttle_time_ms=0,
        brokers=[_R.MetadataResponseBroker(node_id=record.broker_id, host=endpoint.host,
                                           port=endpoint.port, rack=record.rack)
                 for record, endpoint in engine.leadership.brokers_for(ctx)],
        cluster_id=engine.config.cluster_id, controller_id=engine.cluster.controller_id(),
        topics=[],
        authorized_operations=cluster_operations, error_code=0,
    )
    return MetadataAnswer(head, topics)


_BROKER_ENDPOINT, _CONTROLLER_ENDPOINT = 1, 2
"""DescribeCluster's endpoint types (KIP-919)."""


async def handle_describe_cluster(engine: Engine, ctx: RequestContext,
                                  request: DescribeClusterRequest) -> DescribeClusterResponse:
    """Answer DescribeCluster with the live brokers on the caller's listener."""
    version = request.version
    # as Kafka: v1+ names the endpoint type it wants (v0 always a broker's); a broker serves
    # BROKER (1), CONTROLLER (2) is the wrong type, any other is unknown
    if version >= 1 and request.endpoint_type != _BROKER_ENDPOINT:
        wrong = request.endpoint_type == _CONTROLLER_ENDPOINT
        return DescribeClusterResponse(
            version=version, throttle_time_ms=0,
            error_code=ErrorCode.MISMATCHED_ENDPOINT_TYPE if wrong
            else ErrorCode.UNSUPPORTED_ENDPOINT_TYPE,
            error_message="The request was sent to an endpoint of type BROKER, but we wanted "
            "an endpoint of type CONTROLLER" if wrong
            else f"Unsupported endpoint type {request.endpoint_type}",
            endpoint_type=request.endpoint_type,
            cluster_id=engine.config.cluster_id, controller_id=-1, brokers=[],
            authorized_operations=None,
        )
    operations = (
        authorized_operations(engine, ctx, ResourceType.CLUSTER, CLUSTER_NAME)
        if request.include_cluster_authorized_operations else None
    )
    return DescribeClusterResponse(
        version=version, throttle_time_ms=0, error_code=0, error_message=None,
        endpoint_type=1, cluster_id=engine.config.cluster_id,
        controller_id=engine.cluster.controller_id(),
        brokers=[DescribeClusterResponse.DescribeClusterBroker(
            broker_id=record.broker_id, host=endpoint.host, port=endpoint.port,
            rack=record.rack, is_fenced=False,
        ) for record, endpoint in engine.leadership.brokers_for(ctx)],
        authorized_operations=operations,
    )
