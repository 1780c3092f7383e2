"""Group membership APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
ListGroups, DescribeGroups and DeleteGroups."""

from __future__ import annotations

import asyncio

from kafka.protocol.admin import (
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.consumer import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from broker_core.apis.authorized_operations import authorized_operations
from broker_core.codec.framing import received_bytes
from broker_core.context import Endpoint, Operation, RequestContext, ResourceType
from broker_core.engine import Engine
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.groups.effects import JoinRequest
from broker_core.groups.model import GroupState, JoinResult, SyncResult
from broker_core.stages import Later, answer_later
from broker_core.system_topics import StateCoordinator

GROUP_KEY = 0
TRANSACTION_KEY = 1


def group_allowed(engine: Engine, ctx: RequestContext, operation: Operation,
                  group_id: str) -> bool:
    """Whether the caller may apply ``operation`` to the group."""
    return engine.authorizer.authorize(ctx, operation, ResourceType.GROUP, group_id)


def group_error(engine: Engine, ctx: RequestContext, group_id: str,
                operation: Operation = Operation.READ, coordinated_here: bool = True
                ) -> ErrorCode:
    """The error that stops a request for ``group_id`` before the coordinator sees it
    (without ``coordinated_here``: only authorization and the id's validity)."""
    if not group_allowed(engine, ctx, operation, group_id):
        return ErrorCode.GROUP_AUTHORIZATION_FAILED
    if not group_id or len(group_id) > engine.config.groups.group_id_max_length:
        return ErrorCode.INVALID_GROUP_ID
    if not coordinated_here:
        return ErrorCode.NONE
    return engine.groups.check(engine.tenancy.offsets_topic(ctx),
                               engine.tenancy.scoped_id(ctx, group_id))


def coordinator_of(engine: Engine, ctx: RequestContext, key_type: int,
                   key: str) -> tuple[int, Endpoint, tuple[str, int]]:
    """The broker coordinating ``key``, where the caller reaches it, and the state-topic
    partition that holds the key (whose owner coordinates it: the one ownership function);
    COORDINATOR_NOT_AVAILABLE while no live broker can take it."""
    if key_type == TRANSACTION_KEY:
        coordinator: StateCoordinator = engine.transactions
        topic = engine.tenancy.txn_topic(ctx)
    else:
        coordinator, topic = engine.groups, engine.tenancy.offsets_topic(ctx)
    partition = coordinator.place(topic, engine.tenancy.scoped_id(ctx, key))
    info = engine.logs.topic(topic)
    leader = None if info is None else engine.cluster.leader(topic, partition,
                                                              info.num_partitions)
    endpoint = None if leader is None else engine.leadership.endpoint_of(ctx, leader.broker_id)
    if leader is None or endpoint is None:
        raise KafkaApiError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                            f"no live broker coordinates {key!r} yet")
    return leader.broker_id, endpoint, (topic, partition)


async def handle_find_coordinator(engine: Engine, ctx: RequestContext,
                                  request: FindCoordinatorRequest) -> FindCoordinatorResponse:
    """Name the coordinator of each key, at its address on the caller's listener."""
    version: int = request.version
    keys = list(request.coordinator_keys) if version >= 4 else [request.key]
    key_type = request.key_type if version >= 1 else GROUP_KEY
    answers = []
    for key in keys:
        code, message = ErrorCode.NONE, None
        if key_type == TRANSACTION_KEY:
            if not engine.config.transactions.enabled:
                code, message = ErrorCode.COORDINATOR_NOT_AVAILABLE, \
                    "transactions are disabled (kafkaTransactionCoordinatorEnabled=false)"
            elif not engine.authorizer.authorize(ctx, Operation.DESCRIBE,
                                                 ResourceType.TRANSACTIONAL_ID, key):
                code, message = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, None
        elif key_type != GROUP_KEY:
            code, message = ErrorCode.COORDINATOR_NOT_AVAILABLE, \
                f"no coordinator for key type {key_type}"
        elif not group_allowed(engine, ctx, Operation.DESCRIBE, key):
            code, message = ErrorCode.GROUP_AUTHORIZATION_FAILED, None
        elif not key or len(key) > engine.config.groups.group_id_max_length:
            code, message = ErrorCode.INVALID_GROUP_ID, f"invalid group id {key!r}"
        node, endpoint = -1, None
        if not code:
            try:
                node, endpoint, partition = coordinator_of(engine, ctx, key_type, key)
                if node == engine.config.broker_id:  # claimed before the client comes
                    await engine.leadership.ready([partition])
            except KafkaApiError as error:
                code, message = error.code, error.message
        answers.append(FindCoordinatorResponse.Coordinator(
            key=key, node_id=node if endpoint else -1,
            host=endpoint.host if endpoint else "", port=endpoint.port if endpoint else -1,
            error_code=code, error_message=message))
    if version >= 4:
        return FindCoordinatorResponse(version=version, throttle_time_ms=0,
                                       coordinators=answers)
    only = answers[0]
    return FindCoordinatorResponse(version=version, throttle_time_ms=0,
                                   error_code=only.error_code,
                                   error_message=only.error_message, node_id=only.node_id,
                                   host=only.host, port=only.port)


async def handle_join_group(engine: Engine, ctx: RequestContext,
                            request: JoinGroupRequest
                            ) -> JoinGroupResponse | Later[JoinGroupResponse]:
    """Join a member to a group and wait for the rebalance (the waiting stage: the member
    is registered once the dispatch stage returns)."""
    version: int = request.version
    R = JoinGroupResponse

    def failed(code: ErrorCode, member_id: str) -> JoinGroupResponse:
        return R(version=version, throttle_time_ms=0, error_code=code, generation_id=-1,
                 protocol_type=None, protocol_name=None if version >= 7 else "",
                 leader="", skip_assignment=False, member_id=member_id, members=[])

    code = group_error(engine, ctx, request.group_id)
    if code != ErrorCode.NONE:
        return failed(code, request.member_id)
    join = JoinRequest(
        member_id=request.member_id,
        group_instance_id=request.group_instance_id if version >= 5 else None,
        client_id=ctx.client_id or "", client_host="/" + ctx.client_host,
        session_timeout_ms=request.session_timeout_ms,
        rebalance_timeout_ms=(request.rebalance_timeout_ms if version >= 1
                              else request.session_timeout_ms),
        protocol_type=request.protocol_type,
        protocols=[(p.name, received_bytes(p.metadata)) for p in request.protocols],
        require_known_member=version >= 4,
        can_skip_assignment=version >= 9,
    )
    joined = await engine.groups.join(engine.tenancy.offsets_topic(ctx),
                                      engine.tenancy.scoped_id(ctx, request.group_id), join)

    def answer(result: JoinResult) -> JoinGroupResponse:
        if result.error != ErrorCode.NONE:
            return failed(result.error, result.member_id)
        return R(version=version, throttle_time_ms=0, error_code=0,
                 generation_id=result.generation, protocol_type=result.protocol_type,
                 protocol_name=result.protocol, leader=result.leader,
                 skip_assignment=result.skip_assignment, member_id=result.member_id,
                 members=[R.JoinGroupResponseMember(member_id=m, group_instance_id=i,
                                                    metadata=d)
                          for m, i, d in result.members])

    if isinstance(joined, asyncio.Future):
        return answer_later(joined, answer)
    return answer(joined)


async def handle_sync_group(engine: Engine, ctx: RequestContext,
                            request: SyncGroupRequest
                            ) -> SyncGroupResponse | Later[SyncGroupResponse]:
    """Distribute the leader's assignment; a follower waits for it (the waiting stage)."""
    version: int = request.version

    def answer(result: SyncResult) -> SyncGroupResponse:
        if result.error == ErrorCode.NONE:
            return SyncGroupResponse(version=version, throttle_time_ms=0, error_code=0,
                                     protocol_type=result.protocol_type,
                                     protocol_name=result.protocol,
                                     assignment=result.assignment)
        return SyncGroupResponse(version=version, throttle_time_ms=0,
                                 error_code=result.error, protocol_type=None,
                                 protocol_name=None, assignment=b"")

    code = group_error(engine, ctx, request.group_id)
    if code != ErrorCode.NONE:
        return answer(SyncResult(code))
    synced = await engine.groups.sync(
        engine.tenancy.offsets_topic(ctx), engine.tenancy.scoped_id(ctx, request.group_id),
        request.member_id, request.group_instance_id if version >= 3 else None,
        request.generation_id, request.protocol_type if version >= 5 else None,
        request.protocol_name if version >= 5 else None,
        {a.member_id: received_bytes(a.assignment) for a in request.assignments})
    if isinstance(synced, asyncio.Future):
        return answer_later(synced, answer)
    return answer(synced)


async def handle_heartbeat(engine: Engine, ctx: RequestContext,
                           request: HeartbeatRequest) -> HeartbeatResponse:
    """Keep a member's session alive; tell it when to rejoin. While the coordinator loads
    the group's partition (or replays it after a write whose outcome is unknown) the
    member is answered NONE, as Kafka answers "blindly" then: its session goes on, and the
    group, once loaded, says whether it must rejoin."""
    version: int = request.version
    code = group_error(engine, ctx, request.group_id)
    if code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
        code = ErrorCode.NONE
    elif code == ErrorCode.NONE:
        code = engine.groups.heartbeat(
            engine.tenancy.offsets_topic(ctx), engine.tenancy.scoped_id(ctx, request.group_id),
            request.member_id,
            request.group_instance_id if version >= 3 else None, request.generation_id)
    return HeartbeatResponse(version=version, throttle_time_ms=0, error_code=code)


async def handle_leave_group(engine: Engine, ctx: RequestContext,
                             request: LeaveGroupRequest) -> LeaveGroupResponse:
    """Remove members from a group (one member before v3, a batch from v3)."""
    version: int = request.version
    leaving = ([(m.member_id, m.group_instance_id) for m in request.members] if version >= 3
               else [(request.member_id, None)])
    code = group_error(engine, ctx, request.group_id)
    if code != ErrorCode.NONE:
        return LeaveGroupResponse(version=version, throttle_time_ms=0, error_code=code,
                                  members=[])
    result = engine.groups.leave(engine.tenancy.offsets_topic(ctx),
                                 engine.tenancy.scoped_id(ctx, request.group_id), leaving)
    if version < 3:  # one member: the request's error, else the member's
        return LeaveGroupResponse(version=version, throttle_time_ms=0,
                                  error_code=result.error or result.members[0])
    return LeaveGroupResponse(
        version=version, throttle_time_ms=0, error_code=result.error,
        members=[] if result.error else [
            LeaveGroupResponse.MemberResponse(member_id=m, group_instance_id=i, error_code=e)
            for (m, i), e in zip(leaving, result.members, strict=True)])


async def handle_list_groups(engine: Engine, ctx: RequestContext,
                             request: ListGroupsRequest) -> ListGroupsResponse:
    """List the caller's groups, optionally filtered by state and type."""
    version: int = request.version
    states = {s.lower() for s in request.states_filter} if version >= 4 else set()
    types = {t.lower() for t in request.types_filter} if version >= 5 else set()
    listed = []
    for group in engine.groups.groups_of(engine.tenancy.offsets_topic(ctx)):
        group_id = engine.tenancy.client_id_of(ctx, group.group_id)
        if group_id is None:
            continue
        if states and group.state.value.lower() not in states:
            continue
        if types and "classic" not in types:
            continue
        if not group_allowed(engine, ctx, Operation.DESCRIBE, group_id):
            continue
        listed.append(ListGroupsResponse.ListedGroup(
            group_id=group_id, protocol_type=group.protocol_type or "",
            group_state=group.state.value, group_type="classic"))
    return ListGroupsResponse(version=version, throttle_time_ms=0, error_code=0,
                              groups=listed)


def _described(engine: Engine, ctx: RequestContext, group_id: str,
               with_ops: bool) -> DescribeGroupsResponse.DescribedGroup:
    D = DescribeGroupsResponse.DescribedGroup
    code = group_error(engine, ctx, group_id, Operation.DESCRIBE)
    group = (engine.groups.find(engine.tenancy.offsets_topic(ctx),
                                engine.tenancy.scoped_id(ctx, group_id))
             if not code else None)
    # As Kafka: every group answered without an error carries its authorized operations,
    # a Dead (unknown) one included.
    operations = (authorized_operations(engine, ctx, ResourceType.GROUP, group_id)
                  if with_ops and not code else None)
    if group is None:
        return D(error_code=code, error_message=None, group_id=group_id,
                 group_state=GroupState.DEAD.value, protocol_type="", protocol_data="",
                 members=[], authorized_operations=operations)
    stable = group.state == GroupState.STABLE
    members = [
        D.DescribedGroupMember(
            member_id=m.member_id, group_instance_id=m.group_instance_id,
            client_id=m.client_id, client_host=m.client_host,
            member_metadata=m.metadata_for(group.protocol) if stable and group.protocol
            else b"",
            member_assignment=m.assignment if stable else b"")
        for m in group.members.values()
    ]
    return D(error_code=0, error_message=None, group_id=group_id,
             group_state=group.state.value, protocol_type=group.protocol_type or "",
             protocol_data=(group.protocol or "") if stable else "", members=members,
             authorized_operations=operations)


async def handle_describe_groups(engine: Engine, ctx: RequestContext,
                                 request: DescribeGroupsRequest) -> DescribeGroupsResponse:
    """Describe groups: state, protocol and members (with assignments when Stable)."""
    version: int = request.version
    with_ops = version >= 3 and bool(request.include_authorized_operations)
    return DescribeGroupsResponse(
        version=version, throttle_time_ms=0,
        groups=[_described(engine, ctx, g, with_ops)
                for g in dict.fromkeys(request.groups)])  # a group named twice: once


async def handle_delete_groups(engine: Engine, ctx: RequestContext,
                               request: DeleteGroupsRequest) -> DeleteGroupsResponse:
    """Delete empty groups with their committed offsets."""
    results = []
    for group_id in request.groups_names:
        code = group_error(engine, ctx, group_id, Operation.DELETE)
        if code == ErrorCode.NONE:
            code = await engine.groups.delete_group(engine.tenancy.offsets_topic(ctx),
                                                    engine.tenancy.scoped_id(ctx, group_id))
        results.append(DeleteGroupsResponse.DeletableGroupResult(group_id=group_id,
                                                                 error_code=code))
    return DeleteGroupsResponse(version=request.version, throttle_time_ms=0, results=results)
