"""CreateTopics, DeleteTopics and CreatePartitions, each topic counted against the
caller's ``controller_mutation_rate`` (KIP-599, ``broker_core.quotas.mutations``)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from kafka.protocol.admin import (
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
)

from broker_core import naming
from broker_core.apis.replica_placement import assignment_error, replication_factor_error
from broker_core.context import Operation, RequestContext
from broker_core.engine import Engine
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.quotas import mutations
from broker_core.quotas.limits import TopicCounts, tenant_of
from broker_core.quotas.mutations import MutationQuota
from broker_core.storage import CapExceeded, NewTopic, TopicExists, TopicInfo
from broker_core.storage_faults import WriteKind
from broker_core.topic_configs import config_source, validate_topic_configs
from broker_core.topic_ids import TopicsById
from common.log_fields import topic_fields

log = logging.getLogger(__name__)
MAX_PARTITIONS_PER_REQUEST = 10_000
"""Kafka's cap on the partitions one CreateTopics or CreatePartitions request may create:
beyond it every topic of the request answers POLICY_VIOLATION and nothing is created."""
_Created = CreateTopicsResponse.CreatableTopicResult
_CreatedConfig = _Created.CreatableTopicConfigs
_Creatable = CreateTopicsRequest.CreatableTopic
_Growth = CreatePartitionsRequest.CreatePartitionsTopic
NO_TOPIC_ID = uuid.UUID(int=0)
_Name = TypeVar("_Name", str, uuid.UUID)


class _Assignment(Protocol):
    """A partition's replicas, as CreateTopics and CreatePartitions assign them."""

    @property
    def broker_ids(self) -> list[int]: ...


def _check_assignments(engine: Engine, internal: str, shown: str, num_partitions: int,
                       assigned: Iterable[tuple[int, _Assignment]]) -> None:
    """INVALID_REPLICA_ASSIGNMENT unless each new partition (index, its assignment) of a
    topic of ``num_partitions`` is assigned exactly the broker the cluster places it on."""
    for index, assignment in assigned:
        error = assignment_error(engine, internal, shown, index, num_partitions,
                                 assignment.broker_ids, exists=False)
        if error is not None:
            raise error


def _partition_count(engine: Engine, wanted: _Creatable) -> int:
    if wanted.assignments:  # Kafka's checks, in its order
        for field_name, value in (("replication factor", wanted.replication_factor),
                                  ("numPartitions", wanted.num_partitions)):
            if value != -1:
                raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                                    f"A manual partition assignment was specified, but "
                                    f"{field_name} was not set to -1.")
        indexes = [a.partition_index for a in wanted.assignments]
        for index, times in Counter(indexes).items():
            if times > 1:
                raise KafkaApiError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                    f"Found multiple manual partition assignments for "
                                    f"partition {index}")
        if sorted(indexes) != list(range(len(indexes))):
            raise KafkaApiError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                "partitions should be a consecutive 0-based integer sequence")
        return len(indexes)
    if wanted.num_partitions == -1:
        return engine.config.default_num_partitions
    if wanted.num_partitions < 1:
        raise KafkaApiError(ErrorCode.INVALID_PARTITIONS,
                            f"number of partitions must be at least 1, not "
                            f"{wanted.num_partitions}")
    return wanted.num_partitions


def _may_create(engine: Engine, ctx: RequestContext, name: str) -> str:
    """The internal name, once the caller may create the topic."""
    internal = engine.tenancy.internal_name(ctx, name)
    engine.tenancy.check_writable(internal)
    if not engine.tenancy.allowed(ctx, Operation.CREATE, internal):
        raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"not allowed to create {name}")
    return internal


def _unified(internal: str) -> str:
    """A topic name as Kafka compares names for collisions: '.' and '_' are one (metric
    names cannot tell them apart), within a tenant's namespace."""
    scope, _, local = internal.rpartition("/")
    return f"{scope}/{local.replace('.', '_')}"


@dataclass
class _Planned:
    """What a CreateTopics request creates, per tenant, as its topics are checked in turn
    (a tenant's caps count the request's earlier topics, not yet created), and the
    tenants' topics as they were, counted once for the request."""

    counts: TopicCounts | None
    topics: Counter[str] = field(default_factory=Counter)
    partitions: Counter[str] = field(default_factory=Counter)
    existing: dict[str, str] | None = None
    """Existing topics by their :func:`_unified` name, read at the first name that needs it."""
    names: dict[str, str] = field(default_factory=dict)
    """The request's topics by their :func:`_unified` name, as they pass."""

    def check_collision(self, engine: Engine, ctx: RequestContext, internal: str,
                        shown: str) -> None:
        """INVALID_TOPIC_EXCEPTION when the topic's name differs from an existing topic's,
        or an earlier one of the request, only by '.' against '_' (as Kafka)."""
        local = internal.rpartition("/")[2]
        if "." not in local and "_" not in local:
            return
        unified = _unified(internal)
        if self.existing is None:
            self.existing = {_unified(t.name): t.name for t in engine.logs.topics()}
        other = self.existing.get(unified) or self.names.get(unified)
        if other is not None and other != internal:
            raise KafkaApiError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                                f"Topic '{shown}' collides with existing topic: "
                                f"{naming.to_client(other, ctx.home)}")

    def check(self, engine: Engine, ctx: RequestContext, internal: str, count: int) -> None:
        """POLICY_VIOLATION when the tenant's caps do not take this topic too."""
        tenant = tenant_of(internal)
        if engine.limits is not None:
            engine.limits.check_create(internal, self.topics[tenant] + 1,
                                       self.partitions[tenant] + count, ctx, self.counts)

    def add(self, internal: str, count: int) -> None:
        """Count a topic the request creates (or, validating only, would create)."""
        self.names.setdefault(_unified(internal), internal)
        tenant = tenant_of(internal)
        self.topics[tenant] += 1
        self.partitions[tenant] += count


def _check_one(engine: Engine, ctx: RequestContext, wanted: _Creatable,
               excess: KafkaApiError | None, planned: _Planned,
               quota: MutationQuota | None) -> tuple[str, int, dict[str, str]]:
    """The internal name, partition count and configs of a topic the caller may create,
    counted against its ``controller_mutation_rate`` (``quota``; None: validating only)."""
    internal = _may_create(engine, ctx, wanted.name)
    # as Kafka: the name, then whether the topic exists, then everything else
    if engine.logs.topic(internal) is not None:
        raise KafkaApiError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {wanted.name} already exists")
    planned.check_collision(engine, ctx, internal, wanted.name)
    nulls = [c.name for c in wanted.configs if c.value is None]
    if nulls:
        raise KafkaApiError(ErrorCode.INVALID_CONFIG,
                            f"Null value not supported for topic configs: {','.join(nulls)}")
    if excess is not None:
        raise excess
    if not wanted.assignments and \
            (error := replication_factor_error(wanted.replication_factor)) is not None:
        raise error
    count = _partition_count(engine, wanted)
    configs = validate_topic_configs({c.name: c.value for c in wanted.configs})
    _check_assignments(engine, internal, wanted.name, count,
                       ((a.partition_index, a) for a in wanted.assignments))
    planned.check(engine, ctx, internal, count)
    if quota is not None:
        quota.record(count)
    planned.add(internal, count)
    return internal, count, configs


async def _create(engine: Engine, ctx: RequestContext,
                  wanted: list[tuple[_Created, NewTopic, str]]) -> list[TopicInfo]:
    """Create the topics checked (each with its result to fill in and the caller's name for
    it) in a worker thread, all at once: the event loop serves every other connection
    meanwhile (10,000 partitions take seconds of file system work). The created ones."""
    if not wanted:
        return []
    outcomes = await asyncio.to_thread(engine.logs.create_topics, [new for _, new, _ in wanted])
    created = []
    for (result, new, name), outcome in zip(wanted, outcomes, strict=True):
        try:
            with engine.faults.guard(f"the new topic {new.name}", WriteKind.TOPICS):
                if isinstance(outcome, OSError):
                    raise outcome
            if isinstance(outcome, TopicExists):
                raise KafkaApiError(ErrorCode.TOPIC_ALREADY_EXISTS,
                                    f"topic {name} already exists")
            if isinstance(outcome, CapExceeded) and engine.limits is not None:
                raise engine.limits.refused_by_storage(ctx, new.name, outcome)
            if isinstance(outcome, Exception):
                raise outcome
        except KafkaApiError as error:
            engine.refusals.refused(ctx, "topic", name, error)
            result.error_code, result.error_message = error.code, error.message
            result.num_partitions = result.replication_factor = -1
            result.configs = []
            continue
        log.info("created topic %s with %d partitions, configs %s", new.name,
                 new.num_partitions, dict(new.configs), extra=topic_fields(new.name, **ctx.who()))
        result.topic_id = outcome.topic_id
        created.append(outcome)
    return created


def _requested(engine: Engine, ctx: RequestContext, wanted: _Creatable) -> int:
    """Partitions a CreateTopics entry asks for, as Kafka counts them against the cap (a
    topic the caller may not create, or that exists, counts for nothing)."""
    try:
        internal = _may_create(engine, ctx, wanted.name)
    except KafkaApiError:
        return 0
    if engine.logs.topic(internal) is not None:  # answered TOPIC_ALREADY_EXISTS
        return 0
    if wanted.assignments:
        return len(wanted.assignments)
    if wanted.num_partitions == -1:
        return engine.config.default_num_partitions
    return max(wanted.num_partitions, 0)


def _excess(total: int) -> KafkaApiError | None:
    if total <= MAX_PARTITIONS_PER_REQUEST:
        return None
    return KafkaApiError(ErrorCode.POLICY_VIOLATION,
                         f"Excessively large number of partitions per request: {total} "
                         f"asked for, at most {MAX_PARTITIONS_PER_REQUEST}")


async def handle_create_topics(engine: Engine, ctx: RequestContext,
                               request: CreateTopicsRequest) -> CreateTopicsResponse:
    """Create topics (or only validate them), one result per requested name."""
    version = request.version
    validate_only = version >= 1 and bool(request.validate_only)
    repeated = _repeated(t.name for t in request.topics)
    excess = _excess(sum(_requested(engine, ctx, t) for t in request.topics
                         if t.name not in repeated))
    results = []
    planned = _Planned(None if engine.limits is None else engine.limits.topic_counts())
    quota = mutations.begin(engine.mutations, ctx, mutations.CREATE_TOPICS_KEY, version)
    to_create: list[tuple[_Created, NewTopic, str]] = []
    async with engine.topic_changes:
        for wanted in request.topics:
            result = _Created(name=wanted.name, error_code=0, error_message=None,
                              num_partitions=-1, replication_factor=-1, configs=[])
            try:
                if wanted.name in repeated:
                    raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                                        f"topic {wanted.name} appears more than once")
                internal, count, configs = _check_one(engine, ctx, wanted, excess, planned,
                                                      None if validate_only else quota)
                result.num_partitions = count
                result.replication_factor = 1
                result.configs = [
                    _CreatedConfig(name=key, value=value, read_only=False,
                                   config_source=config_source(
                                       key, configs, engine.config.configured_topic_defaults),
                                   is_sensitive=False)
                    for key, value in sorted(engine.topic_configs(configs).items())
                ]
                if not validate_only:
                    cap = None if engine.limits is None else engine.limits.storage_cap(
                        internal, engine.config.metadata_namespace)
                    to_create.append((result, NewTopic(internal, count, configs, cap),
                                      wanted.name))
            except KafkaApiError as error:
                engine.refusals.refused(ctx, "topic", wanted.name, error)
                result.error_code = error.code
                result.error_message = error.message
            results.append(result)
        created = await _create(engine, ctx, to_create)
    # the partitions that belong here are served once the answer says the topic exists
    await engine.leadership.ready((topic.name, index) for topic in created
                                  for index in range(topic.num_partitions))
    return CreateTopicsResponse(version=version, throttle_time_ms=quota.throttle_ms(),
                                topics=results)


def _named_by_id(engine: Engine, ctx: RequestContext, topic_id: uuid.UUID,
                 by_id: TopicsById) -> tuple[str, str]:
    """The internal name of the topic with ``topic_id`` and the name the caller knows it by,
    once the caller may describe it. As Kafka answers: an unknown id is UNKNOWN_TOPIC_ID, an
    id the caller may not describe is TOPIC_AUTHORIZATION_FAILED with the name left null
    (nothing says which topic it is)."""
    found = by_id.get(topic_id)
    if found is None:
        raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_ID, f"no topic has id {topic_id}")
    if not engine.tenancy.allowed(ctx, Operation.DESCRIBE, found.name):
        raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                            f"not allowed to delete the topic with id {topic_id}")
    return found.name, naming.to_client(found.name, ctx.home)


async def handle_delete_topics(engine: Engine, ctx: RequestContext,
                               request: DeleteTopicsRequest) -> DeleteTopicsResponse:
    """Delete topics by name (or by id in v6), one result each."""
    version = request.version
    wanted: list[tuple[str | None, uuid.UUID | None]]
    if version >= 6:
        wanted = [(t.name, t.topic_id) for t in request.topics]
    else:
        wanted = [(name, None) for name in request.topic_names]
    results = []
    by_id = TopicsById(engine.logs)
    quota = mutations.begin(engine.mutations, ctx, mutations.DELETE_TOPICS_KEY, version)
    # as Kafka: a name or an id given twice deletes nothing of it
    repeated_names = _repeated(name for name, _ in wanted if name is not None)
    repeated_ids = _repeated(topic_id for _, topic_id in wanted
                             if topic_id not in (None, NO_TOPIC_ID))
    for name, topic_id in wanted:
        result = DeleteTopicsResponse.DeletableTopicResult(
            name=name, topic_id=topic_id if topic_id is not None else NO_TOPIC_ID,
            error_code=0, error_message=None)
        try:
            if name in repeated_names:
                raise KafkaApiError(ErrorCode.INVALID_REQUEST, "Duplicate topic name.")
            if topic_id in repeated_ids:
                raise KafkaApiError(ErrorCode.INVALID_REQUEST, "Duplicate topic id.")
            if name is not None and topic_id not in (None, NO_TOPIC_ID):
                raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                                    "give a topic name or a topic id, not both")
            if name is None and topic_id in (None, NO_TOPIC_ID):
                raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                                    "neither a topic name nor a topic id was given")
            if name is None:
                assert topic_id is not None
                internal, result.name = _named_by_id(engine, ctx, topic_id, by_id)
            else:
                internal = engine.tenancy.internal_name(ctx, name)
            shown = result.name
            engine.tenancy.check_writable(internal)
            if not engine.tenancy.allowed(ctx, Operation.DELETE, internal):
                raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                    f"not allowed to delete {shown}")
            topic = engine.logs.topic(internal)
            if topic is None:
                raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                    f"unknown topic {shown}")
            quota.record(topic.num_partitions)
            result.topic_id = topic.topic_id
            engine.delete_topic(internal)
            log.info("deleted topic %s", internal, extra=topic_fields(internal, **ctx.who()))
        except KafkaApiError as error:
            engine.refusals.refused(ctx, "topic", name if name is not None else
                                    f"with id {topic_id}", error)
            result.error_code = error.code
            result.error_message = error.message
        results.append(result)
    return DeleteTopicsResponse(version=version, throttle_time_ms=quota.throttle_ms(),
                                responses=results)


def _repeated(names: Iterable[_Name]) -> set[_Name]:
    """Names (or ids) that appear more than once in a request (each answers
    INVALID_REQUEST)."""
    return {name for name, count in Counter(names).items() if count > 1}


def _may_grow(engine: Engine, ctx: RequestContext, name: str) -> tuple[str, TopicInfo]:
    """The internal name and topic, once the caller may add partitions to it."""
    engine.tenancy.check_writable(engine.tenancy.internal_name(ctx, name))
    return engine.tenancy.named_topic(ctx, name, Operation.ALTER, "alter")


def _added(engine: Engine, ctx: RequestContext, wanted: _Growth) -> int:
    """Partitions a CreatePartitions entry would add, counted against the cap only for a
    topic the caller may alter (so the cap's answer tells nothing of other topics)."""
    try:
        _internal, topic = _may_grow(engine, ctx, wanted.name)
    except KafkaApiError:
        return 0
    return max(wanted.count - topic.num_partitions, 0)


async def handle_create_partitions(engine: Engine, ctx: RequestContext,
                                   request: CreatePartitionsRequest) -> CreatePartitionsResponse:
    """Grow topics to the requested partition counts."""
    async with engine.topic_changes:
        return await _grow(engine, ctx, request)


async def _grow(engine: Engine, ctx: RequestContext,
                request: CreatePartitionsRequest) -> CreatePartitionsResponse:
    repeated = _repeated(t.name for t in request.topics)
    excess = _excess(sum(_added(engine, ctx, t) for t in request.topics
                         if t.name not in repeated))
    results = []
    counts = None if engine.limits is None else engine.limits.topic_counts()
    quota = mutations.begin(engine.mutations, ctx, mutations.CREATE_PARTITIONS_KEY,
                            request.version)
    for wanted in request.topics:
        code, message = ErrorCode.NONE, None
        try:
            if wanted.name in repeated:
                raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                                    f"topic {wanted.name} appears more than once")
            internal, topic = _may_grow(engine, ctx, wanted.name)
            if excess is not None:
                raise excess
            if wanted.count <= topic.num_partitions:
                raise KafkaApiError(
                    ErrorCode.INVALID_PARTITIONS,
                    f"topic {wanted.name} has {topic.num_partitions} partitions; "
                    f"{wanted.count} would not add any",
                )
            assignments = wanted.assignments or []
            if assignments and len(assignments) != wanted.count - topic.num_partitions:
                raise KafkaApiError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                    "one assignment is needed per new partition")
            _check_assignments(engine, internal, wanted.name, wanted.count,
                               enumerate(assignments, start=topic.num_partitions))
            cap = None
            if engine.limits is not None:
                engine.limits.check_create(internal, 0, wanted.count - topic.num_partitions,
                                           ctx, counts)
                cap = engine.limits.storage_cap(internal, engine.config.metadata_namespace)
            if not request.validate_only:
                quota.record(wanted.count - topic.num_partitions)
                try:
                    with engine.faults.guard(f"the new partitions of {internal}",
                                              WriteKind.TOPICS):
                        # in a worker thread: thousands of partitions take seconds
                        await asyncio.to_thread(engine.logs.add_partitions, internal,
                                                wanted.count, cap)
                except CapExceeded as exceeded:  # another broker's creation came first
                    assert engine.limits is not None
                    raise engine.limits.refused_by_storage(ctx, internal, exceeded) from None
                except ValueError:  # grown through another broker at the same moment
                    raise KafkaApiError(ErrorCode.INVALID_PARTITIONS,
                                        f"topic {wanted.name} was grown meanwhile") from None
                if counts is not None:  # the request's later topics count these
                    counts.add(tenant_of(internal), 0, wanted.count - topic.num_partitions)
                log.info("topic %s now has %d partitions", internal, wanted.count,
                         extra=topic_fields(internal, **ctx.who()))
        except KafkaApiError as error:
            engine.refusals.refused(ctx, "topic", wanted.name, error)
            code, message = error.code, error.message
        results.append(CreatePartitionsResponse.CreatePartitionsTopicResult(
            name=wanted.name, error_code=code, error_message=message))
    return CreatePartitionsResponse(version=request.version,
                                    throttle_time_ms=quota.throttle_ms(), results=results)
