"""Kafka's ACL model: resource types, patterns, operations, permissions, bindings and the
filters of DescribeAcls / DeleteAcls (the store is ``edge.acl_store``, its index for
checks ``edge.acl_index``).

A binding grants or denies one operation on a resource pattern (LITERAL, PREFIXED, or the
LITERAL wildcard ``*``) to a principal ``User:<role>`` (or ``User:*``) from a host (or
``*``). Every binding belongs to a tenant: it only ever applies to that tenant's
resources, so the tenant boundary holds whatever the ACLs say. Topic names are stored as
full ``tenant/namespace/topic`` names; a namespace grant is the PREFIXED binding
``tenant/namespace/``. DENY beats ALLOW.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class AclResource(IntEnum):
    """Resource types, with Kafka's codes."""

    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class AclPattern(IntEnum):
    """Pattern types, with Kafka's codes (ANY and MATCH only appear in filters)."""

    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(IntEnum):
    """Operations, with Kafka's codes."""

    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


class AclPermission(IntEnum):
    """Permission types, with Kafka's codes."""

    ANY = 1
    DENY = 2
    ALLOW = 3


WILDCARD = "*"
# An ALLOW of one of these operations also allows DESCRIBE (resp. DESCRIBE_CONFIGS).
_IMPLIES = {
    AclOperation.DESCRIBE: {AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE,
                            AclOperation.ALTER},
    AclOperation.DESCRIBE_CONFIGS: {AclOperation.ALTER_CONFIGS},
}


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL entry, owned by ``tenant``."""

    tenant: str
    resource: AclResource
    name: str
    pattern: AclPattern
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermission

    def covers(self, name: str) -> bool:
        """Whether the binding's pattern covers a resource name."""
        if self.pattern == AclPattern.PREFIXED:
            return name.startswith(self.name)
        return self.name in (WILDCARD, name)

    def grants(self, operation: AclOperation) -> bool:
        """Whether the binding speaks about ``operation`` (directly, via ALL, or, for an
        ALLOW, via an operation that implies it)."""
        if self.operation in (AclOperation.ALL, operation):
            return True
        return (self.permission == AclPermission.ALLOW
                and self.operation in _IMPLIES.get(operation, set()))


@dataclass(frozen=True, slots=True)
class AclFilter:
    """A DescribeAcls / DeleteAcls filter; None fields match anything."""

    tenant: str | None
    resource: AclResource
    name: str | None
    pattern: AclPattern
    principal: str | None
    host: str | None
    operation: AclOperation
    permission: AclPermission
    topic_name: str | None = None
    """The name as topic bindings hold it (inside the caller's tenant); None: ``name``."""
    cluster: bool = True
    """Whether CLUSTER bindings may be selected."""

    def matches(self, binding: AclBinding) -> bool:
        """Whether ``binding`` is selected by this filter."""
        if self.tenant is not None and binding.tenant != self.tenant:
            return False
        if not self.cluster and binding.resource == AclResource.CLUSTER:
            return False
        if self.resource != AclResource.ANY and binding.resource != self.resource:
            return False
        name = self.name
        if binding.resource == AclResource.TOPIC and self.topic_name is not None:
            name = self.topic_name
        if self.pattern == AclPattern.MATCH:
            if name is not None and not binding.covers(name):
                return False
        else:
            if self.pattern != AclPattern.ANY and binding.pattern != self.pattern:
                return False
            if name is not None and binding.name != name:
                return False
        return all((
            self.principal is None or binding.principal == self.principal,
            self.host is None or binding.host == self.host,
            self.operation == AclOperation.ANY or binding.operation == self.operation,
            self.permission == AclPermission.ANY or binding.permission == self.permission,
        ))
