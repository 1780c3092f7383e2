"""Produce: validate each partition's batch, append it, and answer once it is durable enough."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable

from broker_core import metrics, naming
from broker_core.admin_refusals import MESSAGE_LIMIT, NAME_LIMIT, cut
from broker_core.codec.batch_header import marked_transactional
from broker_core.codec.produce_reader import ProduceBody, TopicData
from broker_core.codec.produce_writer import PartitionAnswer, ProduceAnswer
from broker_core.context import Operation, RequestContext, ResourceType
from broker_core.engine import Admitted, Appended, Engine
from broker_core.errors import CloseConnection, ErrorCode, KafkaApiError
from broker_core.stages import Later
from broker_core.storage import TopicInfo
from broker_core.storage.errors import AppendFenced
from broker_core.storage_faults import WriteKind
from broker_core.transactions.coordinator import TxnKey
from common.log_fields import topic_fields

log = logging.getLogger(__name__)
_Wait = tuple[list[PartitionAnswer], int, 'asyncio.Future[None]']
"""A partition's answer still to settle: its topic's answers, its place there, its wait."""


def _failed(index: int, code: ErrorCode, message: str | None) -> PartitionAnswer:
    return PartitionAnswer(index, code, -1, -1, -1, message)


def _topic(engine: Engine, ctx: RequestContext, name: str) -> tuple[str, TopicInfo]:
    """A produced topic's internal name and info, once per topic of a request (not per
    partition: a request may carry hundreds of one topic's partitions); the error every
    partition of it is refused with, if any."""
    internal = engine.tenancy.internal_name(ctx, name)
    engine.tenancy.check_writable(internal)
    if not engine.tenancy.allowed(ctx, Operation.WRITE, internal):
        raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                            f"not allowed to write to {name}")
    topic = engine.logs.topic(internal)
    if topic is None:
        raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name}")
    return internal, topic


def _found(engine: Engine, ctx: RequestContext, name: str) -> _Found:
    try:
        return _topic(engine, ctx, name)
    except KafkaApiError as error:
        return error


def _transactional(request: ProduceBody) -> bool:
    """Whether a partition's batch is marked transactional (its first batch's attributes,
    as Kafka's ``hasTransactionalRecords`` judges a request)."""
    return any(marked_transactional(data.records)
               for topic in request.topic_data for data in topic.partition_data)


def _txn_refusal(engine: Engine, ctx: RequestContext, request: ProduceBody) -> str | None:
    """Why a transactional produce may not write for its transactional id (Kafka: it names
    one, and WRITE on it; every partition is answered TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
    or None."""
    if not _transactional(request):
        return None
    tid = request.transactional_id
    if tid is None:
        return "transactional records need a transactional id"
    if engine.authorizer.authorize(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
        return None
    return "not allowed to write for the transactional id"


def _admit(engine: Engine, ctx: RequestContext, internal: str, topic: TopicInfo, index: int,
           records: memoryview | None, acks: int, request: ProduceBody,
           txn_key: TxnKey | None) -> Admitted:
    if records is None:
        raise KafkaApiError(ErrorCode.CORRUPT_MESSAGE, "partition data carries no records")
    return engine.admit(internal, index, records, acks, request.version, ctx, topic, txn_key)


_Found = tuple[str, TopicInfo] | KafkaApiError
"""A produced topic's internal name and info, or the error its partitions get."""


def _verify_ahead(engine: Engine, request: ProduceBody, txn_key: TxnKey | None,
                  topics: list[tuple[TopicData, _Found]]
                  ) -> Awaitable[dict[tuple[str, int], KafkaApiError]] | None:
    """In a cluster, the request's transactional batches whose transaction another
    broker coordinates, verified with one read for them all before the first is appended
    (:meth:`Engine.verify_ahead`: what to await for the refusals by (internal topic,
    index)); None for any other request (nothing to await)."""
    if txn_key is None or not engine.txn_verifier.shared or request.acks not in (-1, 0, 1):
        return None
    return engine.verify_ahead(
        ((found[0], data.index, data.records) for topic, found in topics
         if not isinstance(found, KafkaApiError) for data in topic.partition_data), txn_key)


_NAMED_REFUSALS = 3
"""Refused partitions a request's refusal line names after the first (the rest counted)."""


class _Refusals:
    """A produce request's refused partitions, logged in one line once it is handled: the
    first with its message, a few more by name and code, the rest counted (a request may
    carry thousands of partitions, each refused)."""

    __slots__ = ("count", "ctx", "first", "named")

    def __init__(self, ctx: RequestContext) -> None:
        self.ctx = ctx
        self.count = 0
        self.first: tuple[str, int, KafkaApiError] | None = None
        self.named: list[str] = []

    def refused(self, name: str, index: int, error: KafkaApiError) -> PartitionAnswer:
        """Partition ``index`` of ``name`` refused with ``error``: its answer."""
        if error.code != ErrorCode.KAFKA_STORAGE_ERROR:  # that one is logged once per cause
            self.count += 1
            if self.first is None:
                self.first = (name, index, error)
            elif len(self.named) < _NAMED_REFUSALS:
                self.named.append(f"{cut(name, NAME_LIMIT)}-{index}: "
                                  f"{ErrorCode(error.code).name}")
        return _failed(index, error.code, error.message)

    def log(self) -> None:
        """The request's one line, if it refused any partition."""
        if self.first is None:
            return
        name, index, error = self.first
        try:
            internal = naming.to_internal(name, self.ctx.home)
        except KafkaApiError:  # an invalid name: the field is the name as sent
            internal = name
        more = "" if self.count == 1 else \
            f" (and {self.count - 1} more partitions: {', '.join(self.named)}" + \
            (", ..." if self.count - 1 > len(self.named) else "") + ")"
        log.info("produce to %s-%d from %s refused: %s%s", cut(name, NAME_LIMIT), index,
                 self.ctx.client_id, cut(error.message, MESSAGE_LIMIT), more,
                 extra=topic_fields(internal, **self.ctx.who()))


def _stored(index: int, appended: Appended) -> PartitionAnswer:
    return PartitionAnswer(index, 0, appended.base_offset, appended.log_append_time,
                           appended.log_start_offset, None)


async def handle_produce(engine: Engine, ctx: RequestContext,
                         request: ProduceBody
                         ) -> ProduceAnswer | Later[ProduceAnswer] | None:
    """Append every partition's batch (the dispatch stage: offsets are assigned in request
    order, see :mod:`broker_core.stages`; it waits for the claim of a partition that
    belongs here and is not claimed yet, whose batches could only be refused without it,
    for the work on a batch's records a topic's configs need, done in an executor thread,
    and for the commits under way of a partition whose producer state is to be rebuilt);
    the wait for commits or fsyncs is the waiting stage."""
    started = time.perf_counter()
    await engine.leadership.ready_named(
        ctx, ((t.name, (p.index for p in t.partition_data)) for t in request.topic_data))
    acks: int = request.acks
    topics: list[tuple[str, list[PartitionAnswer]]] = []
    waits: list[_Wait] = []
    refusal = _txn_refusal(engine, ctx, request)
    if refusal is not None:
        if acks == 0:
            raise CloseConnection(f"acks=0 produce refused: {refusal}")
        return ProduceAnswer(request.version, [(topic.name, [
            _failed(data.index, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, refusal)
            for data in topic.partition_data]) for topic in request.topic_data])
    tid = request.transactional_id
    txn_key = None if tid is None else \
        (engine.tenancy.txn_topic(ctx), engine.tenancy.scoped_id(ctx, tid))
    refusals = _Refusals(ctx)
    found_topics = [(topic, _found(engine, ctx, topic.name)) for topic in request.topic_data]
    verifying = _verify_ahead(engine, request, txn_key, found_topics)
    ahead = {} if verifying is None else await verifying
    for topic, found in found_topics:
        partitions: list[PartitionAnswer] = []
        for data in topic.partition_data:
            if acks not in (-1, 0, 1):
                partitions.append(_failed(data.index, ErrorCode.INVALID_REQUIRED_ACKS,
                                          f"acks must be -1, 0 or 1, not {acks}"))
                continue
            try:
                if isinstance(found, KafkaApiError):
                    raise found
                admitted = _admit(engine, ctx, *found, data.index, data.records, acks,
                                  request, txn_key)
                if admitted.rework is not None:  # a wait: records worked on elsewhere
                    admitted = await engine.reworked(admitted)
                commits = None if admitted.header.producer_id < 0 else \
                    engine.commits_before_state(admitted.internal, admitted.index,
                                                admitted.partition)
                if commits is not None:  # a wait: a producer state rebuilt counts them
                    admitted = await engine.settled_before_state(admitted, commits)
                if engine.verification_pending(admitted):  # a wait: the coordinator's state
                    admitted = await engine.verified(
                        admitted, ahead.get((admitted.internal, admitted.index)))
                appended = engine.append(admitted)
            except KafkaApiError as error:
                partitions.append(refusals.refused(topic.name, data.index, error))
                continue
            if appended.durable is not None:
                waits.append((partitions, len(partitions), appended.durable))
            partitions.append(_stored(data.index, appended))
        topics.append((topic.name, partitions))
    refusals.log()
    if acks == 0:
        metrics.STAGE_HANDLE.observe(time.perf_counter() - started)
        _close_if_refused(topics)
        return None
    response = ProduceAnswer(request.version, topics)
    if waits:
        return Later(_when_durable(engine, waits, response, started))
    metrics.STAGE_HANDLE.observe(time.perf_counter() - started)
    return response


def _close_if_refused(topics: list[tuple[str, list[PartitionAnswer]]]) -> None:
    """An acks=0 produce gets no answer: a partition refused closes the connection, as
    Kafka's does, so that the producer refreshes its metadata (:class:`CloseConnection`)."""
    refused = [(name, answer) for name, answers in topics for answer in answers
               if answer.error_code != ErrorCode.NONE]
    if refused:
        name, first = refused[0]
        raise CloseConnection(
            f"acks=0 produce refused for {len(refused)} partition(s), first "
            f"{name}-{first.partition}: {ErrorCode(first.error_code).name}")


async def _when_durable(engine: Engine, waits: list[_Wait], response: ProduceAnswer,
                        started: float) -> ProduceAnswer:
    """A produce's waiting stage: each partition answered once its append is durable, or
    with the error of its failed commit or fsync."""
    queued = time.perf_counter()
    # one after the other (no gather: its future and callbacks cost more than the waits,
    # which all end anyway before the answer); a wait that fails otherwise fails the request
    # at once, the others' outcomes are retrieved by their own callbacks
    for partitions, at, wait in waits:
        try:
            await wait
        except AppendFenced as fenced:  # another broker took the partition
            partitions[at] = _failed(partitions[at].partition,
                                     ErrorCode.NOT_LEADER_OR_FOLLOWER, str(fenced))
        except OSError as failed:  # the fsync failed: not durable, retriable
            error = engine.faults.failed(failed, "a partition's fsync", WriteKind.CHECKPOINTS)
            partitions[at] = _failed(partitions[at].partition, error.code, error.message)
    metrics.STAGE_QUEUED.observe(time.perf_counter() - queued)
    metrics.STAGE_HANDLE.observe(time.perf_counter() - started)
    return response
