"""The authorization policy: superusers, the broker's system namespaces, the tenant
boundary, then the ACLs.

The tenant boundary applies to every SASL login, even with ``authorizationEnabled=false``:
a login of tenant B never reaches a topic, group or transactional id of tenant A. The
system namespaces (every tenant's ``<tenant>/<kafkaMetadataNamespace>``, where the broker
keeps offsets, transactions and audit events) belong to the broker: only superusers reach
their topics, whatever ACLs exist (with authorization disabled, so does a connection
without a tenant login, which reaches every topic anyway). With authorization enabled,
each operation also needs an ACL (Kafka's rules: DENY beats ALLOW; READ, WRITE, DELETE
and ALTER imply DESCRIBE).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from broker_core import naming
from broker_core.context import Operation, RequestContext, ResourceType
from edge.acls import AclOperation, AclResource, AclStore

_OPERATIONS = {
    Operation.READ: AclOperation.READ, Operation.WRITE: AclOperation.WRITE,
    Operation.CREATE: AclOperation.CREATE, Operation.DELETE: AclOperation.DELETE,
    Operation.ALTER: AclOperation.ALTER, Operation.DESCRIBE: AclOperation.DESCRIBE,
    Operation.DESCRIBE_CONFIGS: AclOperation.DESCRIBE_CONFIGS,
    Operation.ALTER_CONFIGS: AclOperation.ALTER_CONFIGS,
    Operation.IDEMPOTENT_WRITE: AclOperation.IDEMPOTENT_WRITE,
}
_RESOURCES = {
    ResourceType.TOPIC: AclResource.TOPIC, ResourceType.GROUP: AclResource.GROUP,
    ResourceType.CLUSTER: AclResource.CLUSTER,
    ResourceType.TRANSACTIONAL_ID: AclResource.TRANSACTIONAL_ID,
}


class Policy:
    """Implements the engine's Authorizer."""

    def __init__(self, acls: AclStore, enabled: bool, super_users: Iterable[str],
                 metadata_namespace: str) -> None:
        self.acls = acls
        self.enabled = enabled
        self.super_users = frozenset(super_users)
        self.metadata_namespace = metadata_namespace
        self.on_denied: Callable[[RequestContext, Operation, ResourceType, str, str], None] = (
            lambda *_: None)

    def is_super_user(self, ctx: RequestContext) -> bool:
        """Whether the caller passes every check."""
        return ctx.principal in self.super_users

    def is_system_topic(self, name: str) -> bool:
        """Whether a full topic name (or prefix) lies in one of the broker's system
        namespaces."""
        return naming.in_system_namespace(name, self.metadata_namespace)

    def resource_tenant(self, ctx: RequestContext, resource: ResourceType, name: str) -> str:
        """The tenant a resource belongs to: a topic's first name part, else the caller's."""
        if resource == ResourceType.TOPIC:
            return name.split("/", 1)[0]
        return ctx.home.tenant

    def authorize(self, ctx: RequestContext, operation: Operation, resource: ResourceType,
                  name: str) -> bool:
        """Decide one check."""
        if self.is_super_user(ctx):
            return True
        if resource == ResourceType.TOPIC and self.is_system_topic(name) and (
                self.enabled or ctx.login_tenant is not None):
            self.on_denied(ctx, operation, resource, name, "a system topic of the broker")
            return False
        tenant = self.resource_tenant(ctx, resource, name)
        if ctx.login_tenant is not None and tenant != ctx.login_tenant:
            self.on_denied(ctx, operation, resource, name, "outside the login's tenant")
            return False
        if not self.enabled:
            return True
        if self.acls.decide(tenant, _RESOURCES[resource], name, f"User:{ctx.principal}",
                            ctx.client_host, _OPERATIONS[operation]):
            return True
        self.on_denied(ctx, operation, resource, name, "no ACL allows it")
        return False
