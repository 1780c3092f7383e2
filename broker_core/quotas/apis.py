"""DescribeClientQuotas (API key 48) and AlterClientQuotas (49), answered as Kafka does.

Both need the cluster permission Kafka checks (DESCRIBE_CONFIGS, resp. ALTER_CONFIGS on
the cluster; CLUSTER_AUTHORIZATION_FAILED otherwise), and then a :class:`QuotaScope`
(the edge's tenant policy) says which entities the caller may see and alter. An unknown
entity type, key or match type, a repeated one, or a value that is not positive (or not
whole, for a byte rate) is INVALID_REQUEST; ``validate_only`` checks without storing.
The quotas are one document every broker holds and rewrites whole on each change, so
they are bounded: a request of more than :data:`MAX_ENTRIES` entries is INVALID_REQUEST
(each entry; nothing stored: Kafka has no such limit but its request size), and an entry
that would add an entity beyond ``max_entities`` of its tenant (the operator's entities
without a tenant count as one group) is POLICY_VIOLATION, as a broker policy refuses an
otherwise valid change (changing or removing an existing entity always passes).
Describe filters as Kafka does: each component matches an exact name, the default, or any
name of its type; ``strict`` leaves out entities with types the filter does not name; a
filter combining ``ip`` with ``user`` or ``client-id`` is INVALID_REQUEST (no entity has
both: Kafka refuses the filter rather than answer nothing).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Protocol

from kafka.protocol.admin import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
)

from broker_core.context import Operation, RequestContext
from broker_core.dispatch import ApiSpec
from broker_core.engine import Engine
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.quotas.entities import (
    CLIENT_ID,
    ENTITY_TYPES,
    IP,
    USER,
    EntityError,
    QuotaEntity,
    check_value,
)
from broker_core.quotas.store import Alteration, QuotaStore

log = logging.getLogger(__name__)
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2
MAX_ENTRIES = 1000
"""The most entries one AlterClientQuotas may carry."""
DEFAULT_MAX_ENTITIES = 1000
"""The entities a tenant may hold unless configured (``maxQuotaEntitiesPerTenant``)."""


class QuotaScope(Protocol):
    """Which quota entities a caller may see and alter (beyond the cluster permission)."""

    def may_see(self, ctx: RequestContext, entity: QuotaEntity) -> bool: ...

    def may_alter(self, ctx: RequestContext, entity: QuotaEntity) -> bool: ...


_Filter = list[tuple[str, int, str | None]]


def _filter(components: list[DescribeClientQuotasRequest.ComponentData]) -> _Filter:
    """The request's filter components, checked (KafkaApiError INVALID_REQUEST)."""
    found: _Filter = []
    for component in components:
        kind, match_type, match = component.entity_type, component.match_type, component.match
        if kind not in ENTITY_TYPES:
            raise KafkaApiError(ErrorCode.INVALID_REQUEST, f"unknown entity type {kind!r}")
        if any(kind == seen for seen, _, _ in found):
            raise KafkaApiError(ErrorCode.INVALID_REQUEST, f"entity type {kind!r} repeated")
        if match_type not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED):
            raise KafkaApiError(ErrorCode.INVALID_REQUEST, f"unknown match type {match_type}")
        if (match_type == MATCH_EXACT) != (match is not None):
            raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                                "an exact match needs a name, the other match types none")
        found.append((kind, match_type, match))
    kinds = {kind for kind, _, _ in found}
    if IP in kinds and kinds & {USER, CLIENT_ID}:
        raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                            "an ip filter component cannot be combined with a user or "
                            "client-id one")
    return found


def _selected(entity: QuotaEntity, components: _Filter, strict: bool) -> bool:
    for kind, match_type, match in components:
        has, name = entity.get(kind)
        if not has or (match_type == MATCH_EXACT and name != match) or (
                match_type == MATCH_DEFAULT and name is not None):
            return False
    named = {kind for kind, _, _ in components}
    return not strict or all(kind in named for kind, _ in entity.parts)


class QuotaApis:
    """The two client-quota APIs over one store and scope."""

    def __init__(self, store: QuotaStore, scope: QuotaScope,
                 max_entities: int = DEFAULT_MAX_ENTITIES) -> None:
        self.store = store
        self.scope = scope
        self.max_entities = max_entities

    def specs(self) -> list[ApiSpec]:
        """The ApiSpecs to serve (ApiVersions advertises them)."""
        return [
            ApiSpec(48, DescribeClientQuotasRequest, DescribeClientQuotasResponse, 0, 1,
                    self.describe),
            ApiSpec(49, AlterClientQuotasRequest, AlterClientQuotasResponse, 0, 1,
                    self.alter),
        ]

    async def describe(self, engine: Engine, ctx: RequestContext,
                       request: DescribeClientQuotasRequest) -> DescribeClientQuotasResponse:
        """Handle DescribeClientQuotas."""
        R = DescribeClientQuotasResponse
        try:
            if not engine.tenancy.cluster_allowed(ctx, Operation.DESCRIBE_CONFIGS):
                raise KafkaApiError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                    f"{ctx.principal} may not describe client quotas")
            components = _filter(request.components)
        except KafkaApiError as error:
            return R(version=request.version, throttle_time_ms=0, error_code=error.code,
                     error_message=error.message, entries=None)
        entries = [
            R.EntryData(
                entity=[R.EntryData.EntityData(entity_type=kind, entity_name=name)
                        for kind, name in entity.parts],
                values=[R.EntryData.ValueData(key=key, value=value)
                        for key, value in sorted(values.items())])
            for entity, values in sorted(self.store.quotas.items(), key=lambda i: i[0].sort_key())
            if _selected(entity, components, request.strict) and self.scope.may_see(ctx, entity)
        ]
        return R(version=request.version, throttle_time_ms=0, error_code=0,
                 error_message=None, entries=entries)

    def _alteration(self, engine: Engine, ctx: RequestContext,
                    entry: AlterClientQuotasRequest.EntryData) -> Alteration:
        """One entry checked (KafkaApiError with the entry's error otherwise)."""
        if not engine.tenancy.cluster_allowed(ctx, Operation.ALTER_CONFIGS):
            raise KafkaApiError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                f"{ctx.principal} may not alter client quotas")
        try:
            entity = QuotaEntity.of((e.entity_type, e.entity_name) for e in entry.entity)
            keys = [op.key for op in entry.ops]
            if len(set(keys)) != len(keys):
                raise EntityError(f"a quota key is repeated in {keys}")
            for op in entry.ops:
                check_value(entity, op.key, 1.0 if op.remove else op.value)
        except EntityError as error:
            raise KafkaApiError(ErrorCode.INVALID_REQUEST, str(error)) from error
        if not self.scope.may_alter(ctx, entity):
            raise KafkaApiError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                f"{ctx.principal} may not alter the quotas of "
                                f"{_shown(entity)}")
        return Alteration(entity, {op.key: float(op.value) for op in entry.ops if not op.remove},
                          frozenset(op.key for op in entry.ops if op.remove))

    def _check_room(self, change: Alteration, counts: Counter[str | None]) -> None:
        """POLICY_VIOLATION when ``change`` adds an entity beyond its tenant's
        ``max_entities`` (``counts``: the entities per tenant, this request's included)."""
        if change.entity in self.store.quotas or not change.set:
            return
        tenant = change.entity.tenant
        if counts[tenant] >= self.max_entities:
            whose = "the operator's" if tenant is None else f"tenant {tenant}'s"
            raise KafkaApiError(ErrorCode.POLICY_VIOLATION,
                                f"{whose} client quota entities are at the broker's limit "
                                f"of {self.max_entities}: remove one first")
        counts[tenant] += 1

    async def alter(self, engine: Engine, ctx: RequestContext,
                    request: AlterClientQuotasRequest) -> AlterClientQuotasResponse:
        """Handle AlterClientQuotas: every valid entry is stored in one write."""
        R = AlterClientQuotasResponse
        results = []
        changes = []
        too_many = len(request.entries) > MAX_ENTRIES
        counts: Counter[str | None] | None = None
        for entry in request.entries:
            code, message = ErrorCode.NONE, None
            try:
                if too_many:
                    raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                                        f"{len(request.entries)} entries in one request; at "
                                        f"most {MAX_ENTRIES} are taken")
                change = self._alteration(engine, ctx, entry)
                if counts is None:  # counted once a request, when first needed
                    counts = Counter(entity.tenant for entity in self.store.quotas)
                self._check_room(change, counts)
                changes.append(change)
            except KafkaApiError as error:
                code, message = error.code, error.message
            results.append(R.EntryData(
                error_code=code, error_message=message,
                entity=[R.EntryData.EntityData(entity_type=e.entity_type,
                                               entity_name=e.entity_name)
                        for e in entry.entity]))
        if changes and not request.validate_only:
            await self.store.alter(changes)
            log.info("%s altered the client quotas of %s", ctx.principal,
                     ", ".join(_shown(change.entity) for change in changes[:10])
                     + (f" and {len(changes) - 10} more" if len(changes) > 10 else ""))
        return R(version=request.version, throttle_time_ms=0, entries=results)


def _shown(entity: QuotaEntity) -> str:
    """An entity as a log line or message names it (escaped and bounded: names come from
    clients)."""
    text = ",".join(f"{kind}={'<default>' if name is None else repr(name)}"
                    for kind, name in entity.parts)
    return text if len(text) <= 200 else text[:200] + "..."
