"""Committed offsets: OffsetCommit, OffsetFetch (one group, or many from v8) and OffsetDelete.

Offsets are kept under full internal topic names and answered under the names the client
used (``to_client`` when the client asked for all of them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypedDict

from kafka.protocol.consumer import (
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)

from broker_core import naming
from broker_core.apis.groups import group_allowed, group_error
from broker_core.context import Operation, RequestContext
from broker_core.engine import Engine
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.groups.model import CONSUMER_PROTOCOL, CommittedOffset, GroupState
from broker_core.groups.offsets import OffsetToCommit

_C = OffsetCommitResponse.OffsetCommitResponseTopic
Fetched = list[tuple[int, CommittedOffset | None, ErrorCode]]


class _WantedTopic(Protocol):
    """A topic whose committed offsets are asked for, in either form of OffsetFetch."""

    @property
    def name(self) -> str: ...
    @property
    def partition_indexes(self) -> list[int]: ...


class _PartitionFields(TypedDict):
    """A partition's committed offset, as both forms of OffsetFetch answer it."""

    partition_index: int
    committed_offset: int
    committed_leader_epoch: int
    metadata: str | None
    error_code: int


def _topic_error(engine: Engine, ctx: RequestContext, name: str, operation: Operation
                 ) -> tuple[str | None, ErrorCode]:
    """The internal name of a client's topic, or the error that rules it out."""
    try:
        internal = engine.tenancy.internal_name(ctx, name)
    except KafkaApiError as error:
        return None, error.code
    if not engine.tenancy.allowed(ctx, operation, internal):
        return internal, ErrorCode.TOPIC_AUTHORIZATION_FAILED
    return internal, ErrorCode.NONE


async def handle_offset_commit(engine: Engine, ctx: RequestContext,
                               request: OffsetCommitRequest) -> OffsetCommitResponse:
    """Commit offsets for a group member (or for a group that only stores offsets). As
    Kafka, a caller denied READ on the group gets GROUP_AUTHORIZATION_FAILED for every
    partition before any topic is looked at (which would tell it which topics exist);
    then each topic's errors, then the group's other errors for the rest."""
    version = request.version
    if not group_allowed(engine, ctx, Operation.READ, request.group_id):
        return _commit_answer(request, {}, ErrorCode.GROUP_AUTHORIZATION_FAILED)
    # v2-v4 carry a retention of the request's own (-1: the broker's), as Kafka keeps it
    own = request.retention_time_ms if 2 <= version <= 4 else -1
    retention = None if own == -1 else own
    errors: dict[tuple[str, int], ErrorCode] = {}
    wanted: list[OffsetToCommit] = []
    names: dict[tuple[str, int], tuple[str, int]] = {}
    for topic in request.topics:
        internal, code = _topic_error(engine, ctx, topic.name, Operation.READ)
        info = engine.logs.topic(internal) if internal is not None and not code else None
        for part in topic.partitions:
            key = (topic.name, part.partition_index)
            if code == ErrorCode.NONE and (info is None or
                                           not 0 <= part.partition_index < info.num_partitions):
                errors[key] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif code != ErrorCode.NONE:
                errors[key] = code
            else:
                assert internal is not None
                names[(internal, part.partition_index)] = key
                wanted.append(OffsetToCommit(
                    internal, part.partition_index, part.committed_offset,
                    part.committed_leader_epoch if version >= 6 else -1,
                    part.committed_metadata, retention))
    code = group_error(engine, ctx, request.group_id)
    if code == ErrorCode.NONE and wanted:
        code, results = await engine.groups.commit(
            engine.tenancy.offsets_topic(ctx), engine.tenancy.scoped_id(ctx, request.group_id),
            request.member_id,
            request.group_instance_id if version >= 7 else None,
            request.generation_id_or_member_epoch, wanted)
        for tp, result in results.items():
            errors[names[tp]] = result
    for key in names.values():
        errors.setdefault(key, code)
    return _commit_answer(request, errors, code)


def _commit_answer(request: OffsetCommitRequest, errors: dict[tuple[str, int], ErrorCode],
                   otherwise: ErrorCode) -> OffsetCommitResponse:
    """The OffsetCommit response: each partition's error in ``errors``, else
    ``otherwise``."""
    topics = []
    for topic in request.topics:
        topics.append(_C(name=topic.name, partitions=[
            _C.OffsetCommitResponsePartition(
                partition_index=p.partition_index,
                error_code=errors.get((topic.name, p.partition_index), otherwise))
            for p in topic.partitions]))
    return OffsetCommitResponse(version=request.version, throttle_time_ms=0, topics=topics)


def _fetch_group(engine: Engine, ctx: RequestContext, group_id: str,
                 topics: Sequence[_WantedTopic] | None,
                 require_stable: bool = False) -> tuple[ErrorCode, list[tuple[str, Fetched]]]:
    """A group's committed offsets per requested topic (all of them when ``topics`` is None)."""
    code = group_error(engine, ctx, group_id, Operation.DESCRIBE)
    if code != ErrorCode.NONE:
        return code, []
    offsets_topic = engine.tenancy.offsets_topic(ctx)
    group_id = engine.tenancy.scoped_id(ctx, group_id)
    unstable = engine.groups.unstable(offsets_topic, group_id) if require_stable else set()
    if topics is None:
        grouped: dict[str, Fetched] = {}
        for (internal, partition), committed in sorted(
                engine.groups.committed(offsets_topic, group_id, None).items()):
            if engine.tenancy.allowed(ctx, Operation.DESCRIBE, internal):
                grouped.setdefault(naming.to_client(internal, ctx.home), []).append(
                    (partition, committed, ErrorCode.UNSTABLE_OFFSET_COMMIT
                     if (internal, partition) in unstable else ErrorCode.NONE))
        return ErrorCode.NONE, list(grouped.items())
    answer: list[tuple[str, Fetched]] = []
    for topic in topics:
        name: str = topic.name
        resolved, topic_code = _topic_error(engine, ctx, name, Operation.DESCRIBE)
        if topic_code != ErrorCode.NONE or resolved is None:
            answer.append((name, [(p, None, topic_code) for p in topic.partition_indexes]))
            continue
        found = engine.groups.committed(offsets_topic, group_id,
                                        [(resolved, p) for p in topic.partition_indexes])
        answer.append((name, [
            (p, found[(resolved, p)], ErrorCode.UNSTABLE_OFFSET_COMMIT
             if (resolved, p) in unstable else ErrorCode.NONE)
            for p in topic.partition_indexes]))
    return ErrorCode.NONE, answer


def _partition_fields(partition: int, committed: CommittedOffset | None,
                      code: ErrorCode) -> _PartitionFields:
    return {
        "partition_index": partition,
        "committed_offset": committed.offset if committed else -1,
        "committed_leader_epoch": committed.leader_epoch if committed else -1,
        "metadata": committed.metadata if committed else "",
        "error_code": code,
    }


async def handle_offset_fetch(engine: Engine, ctx: RequestContext,
                              request: OffsetFetchRequest) -> OffsetFetchResponse:
    """Answer committed offsets, for one group (v1-7) or several (v8+)."""
    version = request.version
    R = OffsetFetchResponse
    if version >= 8:
        groups = []
        named: set[str] = set()
        for wanted in request.groups:
            if wanted.group_id in named:  # answered once: its answer may be large
                continue
            named.add(wanted.group_id)
            code, topics = _fetch_group(engine, ctx, wanted.group_id, wanted.topics,
                                        bool(request.require_stable))
            T = R.OffsetFetchResponseGroup.OffsetFetchResponseTopics
            groups.append(R.OffsetFetchResponseGroup(
                group_id=wanted.group_id, error_code=code,
                topics=[T(name=name, partitions=[
                    T.OffsetFetchResponsePartitions(**_partition_fields(*item))
                    for item in items]) for name, items in topics]))
        return R(version=version, throttle_time_ms=0, groups=groups)
    requested = request.topics
    code, topics = _fetch_group(engine, ctx, request.group_id, requested,
                                version >= 7 and bool(request.require_stable))
    if code != ErrorCode.NONE and version < 2:  # no top-level error before v2
        topics = [(t.name, [(p, None, code) for p in t.partition_indexes])
                  for t in requested or []]
    Topic = R.OffsetFetchResponseTopic
    return R(version=version, throttle_time_ms=0, error_code=code,
             topics=[Topic(name=name, partitions=[
                 Topic.OffsetFetchResponsePartition(**_partition_fields(*item))
                 for item in items]) for name, items in topics])


async def handle_offset_delete(engine: Engine, ctx: RequestContext,
                               request: OffsetDeleteRequest) -> OffsetDeleteResponse:
    """Delete committed offsets of topics the group no longer consumes (KIP-496), as
    Kafka: DELETE on the group, else GROUP_AUTHORIZATION_FAILED for the whole request;
    READ on each topic, else TOPIC_AUTHORIZATION_FAILED for its partitions; then
    UNKNOWN_TOPIC_OR_PARTITION for partitions that do not exist; GROUP_ID_NOT_FOUND for a
    group that does not exist; GROUP_SUBSCRIBED_TO_TOPIC for the topics a member of a
    consumer group subscribes to, and for every topic while its subscriptions are unknown
    (its first rebalance has not chosen a protocol yet, or a member's metadata cannot be
    read: Kafka's ``isSubscribedToTopic``); NON_EMPTY_GROUP for a group with members of
    another protocol. A group-level error is answered without topics, as Kafka's
    ``getErrorResponse``."""
    R = OffsetDeleteResponse
    T = R.OffsetDeleteResponseTopic

    def answer(code: ErrorCode, per: dict[tuple[str, int], ErrorCode]) -> OffsetDeleteResponse:
        topics = [] if code != ErrorCode.NONE else [
            T(name=t.name, partitions=[T.OffsetDeleteResponsePartition(
                partition_index=p.partition_index,
                error_code=per.get((t.name, p.partition_index), ErrorCode.NONE))
                for p in t.partitions]) for t in request.topics]
        return R(version=request.version, throttle_time_ms=0, error_code=code, topics=topics)

    code = group_error(engine, ctx, request.group_id, Operation.DELETE)
    group = (engine.groups.find(engine.tenancy.offsets_topic(ctx),
                                engine.tenancy.scoped_id(ctx, request.group_id))
             if code == ErrorCode.NONE else None)
    if code == ErrorCode.NONE and (group is None or group.state == GroupState.DEAD):
        code = ErrorCode.GROUP_ID_NOT_FOUND
    if code != ErrorCode.NONE or group is None:
        return answer(code, {})
    if group.state != GroupState.EMPTY and group.protocol_type != CONSUMER_PROTOCOL:
        return answer(ErrorCode.NON_EMPTY_GROUP, {})
    subscribed = group.subscribed_topics() if group.state != GroupState.EMPTY else set()
    per: dict[tuple[str, int], ErrorCode] = {}
    doomed = []
    for topic in request.topics:
        internal, topic_code = _topic_error(engine, ctx, topic.name, Operation.READ)
        info = engine.logs.topic(internal) if internal is not None and not topic_code else None
        for part in topic.partitions:
            key = (topic.name, part.partition_index)
            if topic_code != ErrorCode.NONE or internal is None:
                per[key] = topic_code
            elif info is None or not 0 <= part.partition_index < info.num_partitions:
                per[key] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif subscribed is None or naming.named_in(internal, subscribed):
                per[key] = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
            else:
                doomed.append((internal, part.partition_index))
    try:
        await engine.groups.delete_offsets(group, doomed)
    except KafkaApiError as error:  # the write failed (a full disk): nothing was deleted
        return answer(error.code, per)
    return answer(ErrorCode.NONE, per)
