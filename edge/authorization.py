"""The authorization policy: superusers, the broker's system namespaces, the tenant
boundary, then the ACLs.

The tenant boundary applies to every SASL login, even with ``authorizationEnabled=false``:
a login of tenant B never reaches a topic, group or transactional id of tenant A, unless its
role is a superuser, which passes every check. The system namespaces (every tenant's
``<tenant>/<kafkaMetadataNamespace>``, where the broker keeps offsets, transactions and
audit events) belong to the broker: only superusers reach their topics, whatever ACLs exist
(with authorization disabled, so does a connection without a tenant login, which reaches
every topic anyway). A connection without a SASL login has no tenant (``login_tenant`` is
None): only the ACLs apply to it. With authorization enabled, each operation also needs an
ACL (Kafka's rules: DENY beats ALLOW; READ, WRITE, DELETE and ALTER imply DESCRIBE).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from broker_core import naming
from broker_core.context import OPERATION_CODES, Operation, RequestContext, ResourceType
from edge.acl_store import AclStore
from edge.acls import AclOperation, AclResource

_RESOURCES = {
    ResourceType.TOPIC: AclResource.TOPIC, ResourceType.GROUP: AclResource.GROUP,
    ResourceType.CLUSTER: AclResource.CLUSTER,
    ResourceType.TRANSACTIONAL_ID: AclResource.TRANSACTIONAL_ID,
}


class Policy:
    """Implements the engine's Authorizer."""

    def __init__(self, acls: AclStore, enabled: bool, super_users: Iterable[str],
                 metadata_namespace: str, default_tenant: str = "public") -> None:
        self.acls = acls
        self.enabled = enabled
        self.default_tenant = default_tenant
        """``kafkaTenant``: the tenant whose group, transactional-id and CLUSTER ACLs also
        judge connections without a tenant login (see :meth:`resource_tenant`)."""
        self.super_users = frozenset(super_users)
        self.metadata_namespace = metadata_namespace
        self.on_denied: Callable[[RequestContext, Operation, ResourceType, str, str], None] = (
            lambda *_: None)

    def is_super_user(self, ctx: RequestContext) -> bool:
        """Whether the caller passes every check."""
        return ctx.principal in self.super_users

    def is_operator(self, ctx: RequestContext) -> bool:
        """A superuser, or a connection without a tenant login (which, authorized, reaches
        every tenant's topics): the broker's operator, not one tenant. It manages every
        quota and sees where the storage lives (DescribeLogDirs, the BROKER resource)."""
        return ctx.login_tenant is None or self.is_super_user(ctx)

    def is_system_topic(self, name: str) -> bool:
        """Whether a full topic name (or prefix) lies in one of the broker's system
        namespaces."""
        return naming.in_system_namespace(name, self.metadata_namespace)

    def login_refusal(self, principal: str, tenant: str, host: str) -> str | None:
        """Why a login of ``principal`` from ``host`` may not use ``tenant``, or None: with
        authorization enabled, only a superuser or a role that holds at least one ALLOW ACL
        of the tenant (any resource type, ``User:*`` included) may log in to it, so that a
        role with no business there neither reaches it nor counts in its quotas on
        connections. Without authorization any role may use any tenant."""
        if not self.enabled or principal in self.super_users:
            return None
        if self.acls.allows_something(tenant, f"User:{principal}", host):
            return None
        return f"role {principal} may not use tenant {tenant}"

    def resource_tenant(self, ctx: RequestContext, resource: ResourceType, name: str) -> str:
        """The tenant a resource belongs to: a topic's first name part, else the caller's."""
        if resource == ResourceType.TOPIC:
            return name.split("/", 1)[0]
        return ctx.home.tenant

    def authorize(self, ctx: RequestContext, operation: Operation, resource: ResourceType,
                  name: str, log_denied: bool = True) -> bool:
        """Decide one check (a denial is reported through ``on_denied`` if ``log_denied``)."""
        reason = self._refusal(ctx, operation, resource, name)
        if reason is not None and log_denied:
            self.on_denied(ctx, operation, resource, name, reason)
        return reason is None

    def authorize_any(self, ctx: RequestContext, operation: Operation,
                      resource: ResourceType) -> bool:
        """Whether some resource of the type may get ``operation`` (Kafka's
        ``authorizeByResourceType``): the caller's tenant's resources for a login, any
        tenant's topics for a connection without one."""
        if not self.enabled or self.is_super_user(ctx):
            return True
        tenant = ctx.login_tenant
        if tenant is None and resource != ResourceType.TOPIC:
            tenant = ctx.home.tenant
        return self.acls.decide_any(tenant, _RESOURCES[resource], f"User:{ctx.principal}",
                                    ctx.client_host, AclOperation(OPERATION_CODES[operation]))

    def _refusal(self, ctx: RequestContext, operation: Operation, resource: ResourceType,
                 name: str) -> str | None:
        """Why the check fails, or None when it passes."""
        if self.is_super_user(ctx):
            return None
        if resource == ResourceType.TOPIC and self.is_system_topic(name) and (
                self.enabled or ctx.login_tenant is not None):
            return "a system topic of the broker"
        tenant = self.resource_tenant(ctx, resource, name)
        if ctx.login_tenant is not None and tenant != ctx.login_tenant:
            return "outside the login's tenant"
        if not self.enabled or self.acls.decide(
                tenant, _RESOURCES[resource], name, f"User:{ctx.principal}", ctx.client_host,
                AclOperation(OPERATION_CODES[operation])):
            return None
        return "no ACL allows it"
