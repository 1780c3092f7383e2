"""Transaction APIs: InitProducerId, AddPartitionsToTxn (client and batched forms),
AddOffsetsToTxn, TxnOffsetCommit, EndTxn, and the admin views DescribeProducers,
DescribeTransactions and ListTransactions."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Sequence
from typing import Protocol, TypeVar

from kafka.protocol.admin import (
    DescribeProducersRequest,
    DescribeProducersResponse,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
)
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)

from broker_core import naming
from broker_core.apis.groups import group_error
from broker_core.client_patterns import client_pattern
from broker_core.context import Operation, RequestContext, ResourceType
from broker_core.engine import Engine
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.groups.offsets import OffsetToCommit
from broker_core.transactions.model import TxnState

_Batched = AddPartitionsToTxnResponse.AddPartitionsToTxnResult
_TopicResult = TypeVar("_TopicResult", AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult,
                       _Batched.AddPartitionsToTxnTopicResult)
TopicCodes = list[tuple[str, list[tuple[int, ErrorCode]]]]
"""Per topic of one transaction of AddPartitionsToTxn: each partition's error code."""


class _TxnTopic(Protocol):
    """A topic and partitions to add, as both forms of AddPartitionsToTxn name them."""

    @property
    def name(self) -> str: ...
    @property
    def partitions(self) -> list[int]: ...


def _fenced_code(code: ErrorCode, version: int, first_version: int) -> ErrorCode:
    """Older clients know PRODUCER_FENCED as INVALID_PRODUCER_EPOCH."""
    if code == ErrorCode.PRODUCER_FENCED and version < first_version:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return code


def _txn_error(engine: Engine, ctx: RequestContext, transactional_id: str,
               coordinated_here: bool = True) -> ErrorCode:
    """Why the caller may not act on the transactional id (authorization), or, with
    ``coordinated_here``, why this broker cannot coordinate it now."""
    if not engine.authorizer.authorize(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID,
                                       transactional_id):
        return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    if not coordinated_here:
        return ErrorCode.NONE
    return engine.transactions.check(engine.tenancy.txn_topic(ctx),
                                     engine.tenancy.scoped_id(ctx, transactional_id))


def _idempotence_error(engine: Engine, ctx: RequestContext) -> ErrorCode:
    """Kafka's rule for a producer id without a transactional id (KIP-679): IDEMPOTENT_WRITE
    on the cluster, or WRITE on some topic; CLUSTER_AUTHORIZATION_FAILED otherwise."""
    if engine.tenancy.cluster_allowed(ctx, Operation.IDEMPOTENT_WRITE, log_denied=False) or \
            engine.authorizer.authorize_any(ctx, Operation.WRITE, ResourceType.TOPIC):
        return ErrorCode.NONE
    engine.tenancy.cluster_allowed(ctx, Operation.IDEMPOTENT_WRITE)  # reports the denial
    return ErrorCode.CLUSTER_AUTHORIZATION_FAILED


async def _attempt(action: Awaitable[object]) -> ErrorCode:
    try:
        await action
    except KafkaApiError as error:
        return error.code
    return ErrorCode.NONE


async def handle_init_producer_id(engine: Engine, ctx: RequestContext,
                                  request: InitProducerIdRequest) -> InitProducerIdResponse:
    """A producer id and epoch for an idempotent or transactional producer."""
    version = request.version
    R = InitProducerIdResponse
    tid = request.transactional_id
    code = _txn_error(engine, ctx, tid) if tid is not None else _idempotence_error(engine, ctx)
    pid, epoch = -1, -1
    if code == ErrorCode.NONE:
        try:
            pid, epoch = await engine.transactions.init_producer_id(
                engine.tenancy.txn_topic(ctx),
                engine.tenancy.scoped_id(ctx, tid) if tid is not None else None,
                request.transaction_timeout_ms,
                request.producer_id if version >= 3 else -1,
                request.producer_epoch if version >= 3 else -1)
        except KafkaApiError as error:
            code = error.code
    return R(version=version, throttle_time_ms=0,
             error_code=_fenced_code(code, version, 4), producer_id=pid, producer_epoch=epoch)


async def _add_partitions(engine: Engine, ctx: RequestContext, tid: str, pid: int, epoch: int,
                          topics: Sequence[_TxnTopic], version: int) -> TopicCodes:
    """Per-topic results for one transaction of AddPartitionsToTxn."""
    errors: dict[tuple[str, int], ErrorCode] = {}
    wanted: list[tuple[str, int]] = []
    code = _txn_error(engine, ctx, tid)
    for topic in topics:
        for index in topic.partitions:
            try:
                internal = engine.tenancy.internal_name(ctx, topic.name)
                engine.tenancy.check_writable(internal)
                if not engine.tenancy.allowed(ctx, Operation.WRITE, internal):
                    raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, topic.name)
                engine.require_partition(internal, index)
                wanted.append((internal, index))
            except KafkaApiError as error:
                errors[(topic.name, index)] = error.code
    if code == ErrorCode.NONE and errors:
        code = ErrorCode.OPERATION_NOT_ATTEMPTED
    if code == ErrorCode.NONE:
        code = await _attempt(engine.transactions.add_partitions(
            engine.tenancy.txn_topic(ctx), engine.tenancy.scoped_id(ctx, tid), pid, epoch, wanted))
    code = _fenced_code(code, version, 2)
    return [(topic.name, [(index, errors.get((topic.name, index), code))
                          for index in topic.partitions]) for topic in topics]


def _topic_results(result: type[_TopicResult], codes: TopicCodes) -> list[_TopicResult]:
    """``codes`` as the topic results of either form (the same fields, two schema classes)."""
    return [result(name=name, results_by_partition=[
        result.AddPartitionsToTxnPartitionResult(partition_index=index,
                                                 partition_error_code=code)
        for index, code in partitions]) for name, partitions in codes]


async def handle_add_partitions_to_txn(
        engine: Engine, ctx: RequestContext,
        request: AddPartitionsToTxnRequest) -> AddPartitionsToTxnResponse:
    """Add partitions to a transaction (one transaction before v4, a batch from v4)."""
    version = request.version
    R = AddPartitionsToTxnResponse
    if version < 4:
        codes = await _add_partitions(
            engine, ctx, request.v3_and_below_transactional_id,
            request.v3_and_below_producer_id, request.v3_and_below_producer_epoch,
            request.v3_and_below_topics, version)
        return R(version=version, throttle_time_ms=0,
                 results_by_topic_v3_and_below=_topic_results(
                     R.AddPartitionsToTxnTopicResult, codes))
    if not engine.tenancy.cluster_allowed(ctx, Operation.CLUSTER_ACTION):
        # Kafka: v4 and later are the brokers' own form (verify_only tells a partition
        # leader what a coordinator knows), for CLUSTER_ACTION holders only
        return R(version=version, throttle_time_ms=0,
                 error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, results_by_transaction=[])
    answers = []
    for txn in request.transactions:
        if txn.verify_only:
            codes = _verify_only(engine, ctx, txn)
        else:
            codes = await _add_partitions(engine, ctx, txn.transactional_id,
                                          txn.producer_id, txn.producer_epoch, txn.topics,
                                          version)
        answers.append(_Batched(transactional_id=txn.transactional_id,
                                topic_results=_topic_results(
                                    _Batched.AddPartitionsToTxnTopicResult, codes)))
    return R(version=version, throttle_time_ms=0, error_code=0, results_by_transaction=answers)


def _verify_only(engine: Engine, ctx: RequestContext,
                 txn: AddPartitionsToTxnRequest.AddPartitionsToTxnTransaction
                 ) -> TopicCodes:
    """The batched form's verify_only: report whether each partition is in the transaction
    (a topic the caller may not describe, such as another tenant's: TOPIC_AUTHORIZATION_FAILED,
    so that no tenant learns of another's transactions)."""
    results: TopicCodes = []
    for topic in txn.topics:
        partitions = []
        for index in topic.partitions:
            try:
                internal = engine.tenancy.internal_name(ctx, topic.name)
                if not engine.tenancy.allowed(ctx, Operation.DESCRIBE, internal):
                    raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, topic.name)
                engine.transactions.verify_produce(
                    txn.producer_id, txn.producer_epoch,
                    (engine.tenancy.txn_topic(ctx),
                     engine.tenancy.scoped_id(ctx, txn.transactional_id)), internal, index)
                code = ErrorCode.NONE
            except KafkaApiError as error:
                code = error.code
            partitions.append((index, code))
        results.append((topic.name, partitions))
    return results


async def handle_add_offsets_to_txn(engine: Engine, ctx: RequestContext,
                                    request: AddOffsetsToTxnRequest) -> AddOffsetsToTxnResponse:
    """Add a consumer group to a transaction."""
    version = request.version
    code = _txn_error(engine, ctx, request.transactional_id)
    if code == ErrorCode.NONE:  # the group's coordinator may be another broker
        code = group_error(engine, ctx, request.group_id, coordinated_here=False)
    if code == ErrorCode.NONE:
        code = await _attempt(engine.transactions.add_group(
            engine.tenancy.txn_topic(ctx), engine.tenancy.scoped_id(ctx, request.transactional_id),
            request.producer_id,
            request.producer_epoch,
            (engine.tenancy.offsets_topic(ctx), engine.tenancy.scoped_id(ctx, request.group_id))))
    return AddOffsetsToTxnResponse(version=version, throttle_time_ms=0,
                                   error_code=_fenced_code(code, version, 2))


async def handle_txn_offset_commit(engine: Engine, ctx: RequestContext,
                                   request: TxnOffsetCommitRequest) -> TxnOffsetCommitResponse:
    """Commit offsets inside a transaction: they count once the transaction commits."""
    version = request.version
    R = TxnOffsetCommitResponse
    T = R.TxnOffsetCommitResponseTopic
    errors: dict[tuple[str, int], ErrorCode] = {}
    wanted: list[OffsetToCommit] = []
    names: dict[tuple[str, int], tuple[str, int]] = {}
    for topic in request.topics:
        for part in topic.partitions:
            key = (topic.name, part.partition_index)
            try:
                internal = engine.tenancy.internal_name(ctx, topic.name)
                if not engine.tenancy.allowed(ctx, Operation.READ, internal):
                    raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, topic.name)
                engine.require_partition(internal, part.partition_index)
            except KafkaApiError as error:
                errors[key] = error.code
                continue
            names[(internal, part.partition_index)] = key
            wanted.append(OffsetToCommit(
                internal, part.partition_index, part.committed_offset,
                part.committed_leader_epoch if version >= 2 else -1, part.committed_metadata))
    offsets_topic = engine.tenancy.offsets_topic(ctx)
    group_key = engine.tenancy.scoped_id(ctx, request.group_id)
    txn_topic = engine.tenancy.txn_topic(ctx)
    txn_key = engine.tenancy.scoped_id(ctx, request.transactional_id)
    # the transaction's coordinator may be another broker: then only it can tell whether
    # the transaction added the group (as Kafka before KIP-890, not checked here)
    txn_here = engine.transactions.coordinates(txn_topic, txn_key)
    code = _txn_error(engine, ctx, request.transactional_id, coordinated_here=txn_here)
    if code == ErrorCode.NONE:
        code = group_error(engine, ctx, request.group_id)
    if code == ErrorCode.NONE and txn_here:
        try:
            engine.transactions.check_offsets(
                engine.tenancy.txn_topic(ctx),
                engine.tenancy.scoped_id(ctx, request.transactional_id),
                request.producer_id,
                request.producer_epoch, (offsets_topic, group_key))
        except KafkaApiError as error:
            code = error.code
    if code == ErrorCode.NONE and wanted:
        code, results = await engine.groups.txn_commit(
            offsets_topic, group_key, request.producer_id,
            request.member_id if version >= 3 else "",
            request.group_instance_id if version >= 3 else None,
            request.generation_id if version >= 3 else -1, wanted, request.producer_epoch)
        for tp, result in results.items():
            errors[names[tp]] = result
    code = _fenced_code(code, version, 2)
    return R(version=version, throttle_time_ms=0, topics=[
        T(name=topic.name, partitions=[T.TxnOffsetCommitResponsePartition(
            partition_index=p.partition_index,
            error_code=errors.get((topic.name, p.partition_index), code))
            for p in topic.partitions]) for topic in request.topics])


async def handle_end_txn(engine: Engine, ctx: RequestContext,
                         request: EndTxnRequest) -> EndTxnResponse:
    """Commit or abort a transaction: markers in every partition, group offsets settled."""
    version = request.version
    code = _txn_error(engine, ctx, request.transactional_id)
    if code == ErrorCode.NONE:
        code = await _attempt(engine.transactions.end_txn(
            engine.tenancy.txn_topic(ctx), engine.tenancy.scoped_id(ctx, request.transactional_id),
            request.producer_id,
            request.producer_epoch, bool(request.committed)))
    return EndTxnResponse(version=version, throttle_time_ms=0,
                          error_code=_fenced_code(code, version, 2))


async def handle_describe_producers(
        engine: Engine, ctx: RequestContext,
        request: DescribeProducersRequest) -> DescribeProducersResponse:
    """The active producers of each requested partition."""
    R = DescribeProducersResponse
    T = R.TopicResponse
    P = T.PartitionResponse
    topics = []
    named: set[str] = set()
    for topic in request.topics:
        if topic.name in named:  # answered once, and each partition once: a partition's
            continue  # answer lists every producer id it knows
        named.add(topic.name)
        partitions = []
        for index in dict.fromkeys(topic.partition_indexes):
            try:
                internal = engine.tenancy.internal_name(ctx, topic.name)
                if not engine.tenancy.allowed(ctx, Operation.READ, internal):
                    raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                        f"not allowed to read {topic.name}")
                state = engine.partition_producers(internal, index)
            except KafkaApiError as error:
                partitions.append(P(partition_index=index, error_code=error.code,
                                    error_message=error.message, active_producers=[]))
                continue
            partitions.append(P(partition_index=index, error_code=0, error_message=None,
                                active_producers=[
                P.ProducerState(producer_id=pid, producer_epoch=entry.epoch,
                                last_sequence=entry.last_sequence,
                                last_timestamp=entry.last_timestamp,
                                coordinator_epoch=entry.coordinator_epoch,
                                current_txn_start_offset=(
                                    -1 if (first := state.open_transaction(pid)) is None
                                    else first))
                for pid, entry in sorted(state.producers.items())]))
        topics.append(T(name=topic.name, partitions=partitions))
    return R(version=request.version, throttle_time_ms=0, topics=topics)


async def handle_describe_transactions(
        engine: Engine, ctx: RequestContext,
        request: DescribeTransactionsRequest) -> DescribeTransactionsResponse:
    """The state of each requested transactional id. As Kafka: DESCRIBE on the id is
    checked first (TRANSACTIONAL_ID_AUTHORIZATION_FAILED before whether this broker serves
    it), and the topics the caller may not DESCRIBE are left out of the answer."""
    R = DescribeTransactionsResponse
    S = R.TransactionState
    states = []
    for tid in request.transactional_ids:
        allowed = engine.authorizer.authorize(ctx, Operation.DESCRIBE,
                                              ResourceType.TRANSACTIONAL_ID, tid)
        code = engine.transactions.check(engine.tenancy.txn_topic(ctx),
                                         engine.tenancy.scoped_id(ctx, tid)) \
            if allowed else ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        txn = (engine.transactions.find(engine.tenancy.txn_topic(ctx),
                                        engine.tenancy.scoped_id(ctx, tid))
               if not code else None)
        if txn is None:
            states.append(S(error_code=code or ErrorCode.TRANSACTIONAL_ID_NOT_FOUND,
                            transactional_id=tid, transaction_state="",
                            transaction_timeout_ms=0, transaction_start_time_ms=-1,
                            producer_id=-1, producer_epoch=-1, topics=[]))
            continue
        by_topic: dict[str, list[int]] = {}
        for internal, index in sorted(txn.partitions):
            by_topic.setdefault(internal, []).append(index)
        states.append(S(error_code=0, transactional_id=tid, transaction_state=txn.state.value,
                        transaction_timeout_ms=txn.timeout_ms,
                        transaction_start_time_ms=txn.start_ms, producer_id=txn.producer_id,
                        producer_epoch=txn.epoch,
                        topics=[S.TopicData(topic=naming.to_client(t, ctx.home), partitions=p)
                                for t, p in by_topic.items()
                                if engine.tenancy.allowed(ctx, Operation.DESCRIBE, t,
                                                          log_denied=False)]))
    return R(version=request.version, throttle_time_ms=0, transaction_states=states)


async def handle_list_transactions(engine: Engine, ctx: RequestContext,
                                   request: ListTransactionsRequest) -> ListTransactionsResponse:
    """List the caller's transactional ids, filtered by state, producer, age and pattern."""
    version = request.version
    R = ListTransactionsResponse
    known = {state.value for state in TxnState}
    wanted = set(request.state_filters)
    pids = set(request.producer_id_filters)
    min_age = request.duration_filter if version >= 1 else -1
    pattern = request.transactional_id_pattern if version >= 2 else None
    try:
        matches = client_pattern(pattern) if pattern else None
    except KafkaApiError as error:
        return R(version=version, throttle_time_ms=0, error_code=error.code,
                 unknown_state_filters=[], transaction_states=[])
    now = int(time.time() * 1000)
    listed = []
    for txn in engine.transactions.of_topic(engine.tenancy.txn_topic(ctx)):
        tid = engine.tenancy.client_id_of(ctx, txn.transactional_id)
        if tid is None:
            continue
        if wanted and txn.state.value not in wanted:
            continue
        if pids and txn.producer_id not in pids:
            continue
        if min_age is not None and min_age >= 0 and (
                txn.start_ms < 0 or now - txn.start_ms < min_age):
            continue
        if not engine.authorizer.authorize(ctx, Operation.DESCRIBE,  # as Kafka: filtered,
                                           ResourceType.TRANSACTIONAL_ID, tid,  # not denied
                                           log_denied=False):
            continue
        if matches is not None and not matches(tid):
            continue
        listed.append(R.TransactionState(transactional_id=tid,
                                         producer_id=txn.producer_id,
                                         transaction_state=txn.state.value))
    return R(version=version, throttle_time_ms=0, error_code=0,
             unknown_state_filters=sorted(wanted - known), transaction_states=listed)
