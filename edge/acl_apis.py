"""CreateAcls, DescribeAcls and DeleteAcls over the broker's ACL store.

Names are mapped as topics are: a LITERAL topic ``t`` means the caller's
``tenant/namespace/t``, a PREFIXED ``foo`` means ``tenant/namespace/foo``, and a PREFIXED
name with a ``/`` (``tenant/namespace/``) is a full prefix. Group and transactional-id
bindings belong to the caller's tenant. Only superusers manage other tenants' ACLs, and
no ACL may name a topic of the broker's system namespaces (see ``edge.authorization``).
Only superusers manage the CLUSTER ACLs of the default tenant (``kafkaTenant``): they also
judge connections without a tenant login, which reach every tenant (their quotas, say), so
a tenant admin of ``public`` granting them would reach beyond its tenant.

All tenants' bindings are one document every broker holds, rewrites whole on each change
and indexes again after it, so they are bounded (``maxAclBindingsPerTenant``, as
``maxQuotaEntitiesPerTenant`` bounds the client quotas): a creation that would add a binding
beyond the limit of its tenant (a superuser's count for the tenant they name) answers
POLICY_VIOLATION, as a broker policy refuses an otherwise valid change (a binding that
exists already always passes), and a CreateAcls of more creations than the limit answers
INVALID_REQUEST for each, storing nothing (Kafka has no such limits but its request size).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace
from typing import Protocol

from kafka.protocol.admin import (
    CreateAclsRequest,
    CreateAclsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
)

from broker_core import naming
from broker_core.context import Operation, RequestContext, ResourceType
from broker_core.dispatch import ApiSpec
from broker_core.engine import Engine
from broker_core.errors import ErrorCode, KafkaApiError
from edge.acl_store import AclStore
from edge.acls import (
    WILDCARD,
    AclBinding,
    AclFilter,
    AclOperation,
    AclPattern,
    AclPermission,
    AclResource,
)
from edge.authorization import Policy

log = logging.getLogger(__name__)
_Description = DescribeAclsResponse.DescribeAclsResource.AclDescription
CLUSTER_NAME = "kafka-cluster"
_PERSISTENT = "persistent://"
_DEFAULT_CLUSTER = ("only superusers manage CLUSTER ACLs of tenant {tenant!r}: they also apply "
                    "to connections without a tenant login")


class _FilterFields(Protocol):
    """An ACL filter, as DescribeAcls (the request itself) and DeleteAcls (each filter)
    give it."""

    @property
    def resource_type_filter(self) -> int: ...
    @property
    def resource_name_filter(self) -> str | None: ...
    @property
    def pattern_type_filter(self) -> int: ...
    @property
    def principal_filter(self) -> str | None: ...
    @property
    def host_filter(self) -> str | None: ...
    @property
    def operation(self) -> int: ...
    @property
    def permission_type(self) -> int: ...


def _tenant_of_caller(ctx: RequestContext) -> str:
    return ctx.login_tenant or ctx.home.tenant


def _topic_name(ctx: RequestContext, name: str, pattern: AclPattern) -> str:
    """The stored form of a topic name or prefix given by a client."""
    if name == WILDCARD and pattern != AclPattern.PREFIXED:
        return name
    if pattern == AclPattern.PREFIXED:
        body = name.removeprefix(_PERSISTENT)
        return body if "/" in body else ctx.home.prefix + body
    return naming.to_internal(name, ctx.home)


def _shown_name(ctx: RequestContext, binding: AclBinding) -> str:
    if binding.resource != AclResource.TOPIC or binding.name == WILDCARD:
        return binding.name
    if binding.name.startswith(ctx.home.prefix) and binding.name != ctx.home.prefix:
        return binding.name[len(ctx.home.prefix):]
    return binding.name


def _binding_tenant(ctx: RequestContext, resource: AclResource, name: str) -> str:
    if resource == AclResource.TOPIC and name != WILDCARD:
        return name.split("/", 1)[0]
    return _tenant_of_caller(ctx)


class AclApis:
    """The three ACL APIs, bound to one store and policy."""

    def __init__(self, store: AclStore, policy: Policy, max_bindings: int) -> None:
        self.store = store
        self.policy = policy
        self.max_bindings = max_bindings
        """The bindings a tenant may hold (``maxAclBindingsPerTenant``), and the most
        creations one CreateAcls may carry."""

    def specs(self) -> list[ApiSpec]:
        """The ApiSpecs to serve."""
        return [
            ApiSpec(29, DescribeAclsRequest, DescribeAclsResponse, 1, 3, self.describe),
            ApiSpec(30, CreateAclsRequest, CreateAclsResponse, 1, 3, self.create),
            ApiSpec(31, DeleteAclsRequest, DeleteAclsResponse, 1, 3, self.delete),
        ]

    def _gate(self, engine: Engine, ctx: RequestContext, operation: Operation) -> None:
        if not self.policy.enabled:
            raise KafkaApiError(ErrorCode.SECURITY_DISABLED,
                                "authorization is disabled (authorizationEnabled=false)")
        if not engine.authorizer.authorize(ctx, operation, ResourceType.CLUSTER, CLUSTER_NAME):
            raise KafkaApiError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                f"{ctx.principal} may not manage ACLs")

    def _own(self, ctx: RequestContext, tenant: str) -> None:
        if not self.policy.is_super_user(ctx) and tenant != _tenant_of_caller(ctx):
            raise KafkaApiError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                f"only superusers manage ACLs of tenant {tenant!r}")

    def _manages_default_cluster(self, ctx: RequestContext, tenant: str) -> bool:
        """Whether the caller may manage the CLUSTER ACLs of ``tenant``: anyone who manages
        its ACLs, except for the default tenant's, which only superusers manage."""
        return tenant != self.policy.default_tenant or self.policy.is_super_user(ctx)

    def _refuse_system(self, ctx: RequestContext) -> None:
        """No ACL names a system namespace: only superusers reach its topics, so for anyone
        else it is a resource it may not manage (CLUSTER_AUTHORIZATION_FAILED, as for another
        tenant's ACLs), and from a superuser it is a binding that could never take effect
        (INVALID_REQUEST, as Kafka answers a binding it cannot apply)."""
        if self.policy.is_super_user(ctx):
            raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                                "the topic is in a system namespace of the broker: ACLs do "
                                "not apply there, only superusers reach it")
        raise KafkaApiError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                            "the topic is in a system namespace of the broker: only "
                            "superusers reach it")

    def _binding(self, ctx: RequestContext, item: CreateAclsRequest.AclCreation) -> AclBinding:
        try:
            resource = AclResource(item.resource_type)
            pattern = AclPattern(item.resource_pattern_type)
            operation = AclOperation(item.operation)
            permission = AclPermission(item.permission_type)
        except ValueError as exc:
            raise KafkaApiError(ErrorCode.INVALID_REQUEST, f"invalid ACL: {exc}") from exc
        if resource == AclResource.ANY or pattern not in (AclPattern.LITERAL,
                                                          AclPattern.PREFIXED):
            raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                                "an ACL needs a concrete resource type and a LITERAL or "
                                "PREFIXED pattern")
        if operation == AclOperation.ANY or permission == AclPermission.ANY:
            raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                                "an ACL needs a concrete operation and permission")
        if not item.principal.startswith("User:") or not item.resource_name:
            raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                                "principal must be User:<role> and the name non-empty")
        if resource == AclResource.CLUSTER and item.resource_name != CLUSTER_NAME:
            raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                                f"the cluster resource is named {CLUSTER_NAME!r}")
        name = (_topic_name(ctx, item.resource_name, pattern) if resource == AclResource.TOPIC
                else item.resource_name)
        tenant = _binding_tenant(ctx, resource, name)
        self._own(ctx, tenant)
        if resource == AclResource.CLUSTER and not self._manages_default_cluster(ctx, tenant):
            raise KafkaApiError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                _DEFAULT_CLUSTER.format(tenant=tenant))
        if resource == AclResource.TOPIC and self.policy.is_system_topic(name):
            self._refuse_system(ctx)
        return AclBinding(tenant, resource, name, pattern, item.principal, item.host or "*",
                          operation, permission)

    def _filter(self, ctx: RequestContext, item: _FilterFields) -> AclFilter:
        try:
            resource = AclResource(item.resource_type_filter)
            pattern = AclPattern(item.pattern_type_filter)
            operation = AclOperation(item.operation)
            permission = AclPermission(item.permission_type)
        except ValueError as exc:
            raise KafkaApiError(ErrorCode.INVALID_REQUEST, f"invalid ACL filter: {exc}") \
                from exc
        name = topic_name = item.resource_name_filter
        if name is not None and resource in (AclResource.TOPIC, AclResource.ANY):
            # a filter of any resource type matches topic bindings by their tenant's name
            topic_name = _topic_name(ctx, name, pattern if pattern == AclPattern.PREFIXED
                                     else AclPattern.LITERAL)
        tenant = None if self.policy.is_super_user(ctx) else _tenant_of_caller(ctx)
        return AclFilter(tenant, resource, name, pattern, item.principal_filter,
                         item.host_filter, operation, permission, topic_name)

    def _deletion(self, ctx: RequestContext, item: _FilterFields) -> AclFilter:
        """A DeleteAcls filter: one naming the CLUSTER ACLs of a tenant the caller may not
        manage them of is refused, one of any resource type leaves them alone."""
        selector = self._filter(ctx, item)
        tenant = _tenant_of_caller(ctx)
        if self._manages_default_cluster(ctx, tenant):
            return selector
        if selector.resource == AclResource.CLUSTER:
            raise KafkaApiError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                _DEFAULT_CLUSTER.format(tenant=tenant))
        return replace(selector, cluster=False)

    def _check_room(self, binding: AclBinding, counts: Counter[str],
                    created: set[AclBinding]) -> None:
        """POLICY_VIOLATION when ``binding`` is new and its tenant holds ``max_bindings``
        already (``counts``: the bindings per tenant, this request's ``created`` included)."""
        if binding in self.store.bindings or binding in created:
            return
        if counts[binding.tenant] >= self.max_bindings:
            raise KafkaApiError(ErrorCode.POLICY_VIOLATION,
                                f"tenant {binding.tenant!r}'s ACL bindings are at the "
                                f"broker's limit of {self.max_bindings}: delete one first")
        counts[binding.tenant] += 1

    async def create(self, engine: Engine, ctx: RequestContext,
                     request: CreateAclsRequest) -> CreateAclsResponse:
        """Handle CreateAcls: every valid creation is stored in one change."""
        results = []
        created: set[AclBinding] = set()
        too_many = len(request.creations) > self.max_bindings
        counts: Counter[str] | None = None
        for item in request.creations:
            code, message = ErrorCode.NONE, None
            try:
                if too_many:
                    raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                                        f"{len(request.creations)} creations in one request; "
                                        f"at most {self.max_bindings} are taken")
                self._gate(engine, ctx, Operation.ALTER)
                binding = self._binding(ctx, item)
                if counts is None:  # counted once a request, when first needed
                    counts = self.store.tenant_counts()
                self._check_room(binding, counts, created)
                created.add(binding)
            except KafkaApiError as error:
                code, message = error.code, error.message
            results.append(CreateAclsResponse.AclCreationResult(error_code=code,
                                                                 error_message=message))
        if created:
            await self.store.add(created)
            log.info("%s created %d ACLs", ctx.principal, len(created))
        return CreateAclsResponse(version=request.version, throttle_time_ms=0, results=results)

    async def describe(self, engine: Engine, ctx: RequestContext,
                       request: DescribeAclsRequest) -> DescribeAclsResponse:
        """Handle DescribeAcls."""
        R = DescribeAclsResponse
        try:
            self._gate(engine, ctx, Operation.DESCRIBE)
            found = self.store.find(self._filter(ctx, request))
        except KafkaApiError as error:
            return R(version=request.version, throttle_time_ms=0, error_code=error.code,
                     error_message=error.message, resources=[])
        grouped: dict[tuple[int, str, int], list[_Description]] = {}
        for b in found:
            grouped.setdefault((b.resource, _shown_name(ctx, b), b.pattern), []).append(
                R.DescribeAclsResource.AclDescription(
                    principal=b.principal, host=b.host, operation=b.operation,
                    permission_type=b.permission))
        return R(version=request.version, throttle_time_ms=0, error_code=0, error_message=None,
                 resources=[R.DescribeAclsResource(resource_type=t, resource_name=n,
                                                   pattern_type=p, acls=acls)
                            for (t, n, p), acls in grouped.items()])

    async def delete(self, engine: Engine, ctx: RequestContext,
                     request: DeleteAclsRequest) -> DeleteAclsResponse:
        """Handle DeleteAcls: the valid filters delete in one change, a binding selected
        by several counted under the first."""
        R = DeleteAclsResponse
        F = R.DeleteAclsFilterResult
        outcomes: list[AclFilter | KafkaApiError] = []
        for item in request.filters:
            try:
                self._gate(engine, ctx, Operation.ALTER)
                outcomes.append(self._deletion(ctx, item))
            except KafkaApiError as error:
                outcomes.append(error)
        deleted = iter(await self.store.delete([o for o in outcomes
                                                if isinstance(o, AclFilter)]))
        results = []
        for outcome in outcomes:
            if isinstance(outcome, KafkaApiError):
                results.append(F(error_code=outcome.code, error_message=outcome.message,
                                 matching_acls=[]))
                continue
            results.append(F(error_code=0, error_message=None, matching_acls=[
                F.DeleteAclsMatchingAcl(
                    error_code=0, error_message=None, resource_type=b.resource,
                    resource_name=_shown_name(ctx, b), pattern_type=b.pattern,
                    principal=b.principal, host=b.host, operation=b.operation,
                    permission_type=b.permission) for b in next(deleted)]))
        return R(version=request.version, throttle_time_ms=0, filter_results=results)

