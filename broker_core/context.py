"""What the engine knows about the caller of one request, and how it asks for permission."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from broker_core.naming import Namespace


class Operation(Enum):
    """Operations checked on resources (Kafka's ACL operation names)."""

    READ = "Read"
    WRITE = "Write"
    CREATE = "Create"
    DELETE = "Delete"
    ALTER = "Alter"
    DESCRIBE = "Describe"
    CLUSTER_ACTION = "ClusterAction"
    DESCRIBE_CONFIGS = "DescribeConfigs"
    ALTER_CONFIGS = "AlterConfigs"
    IDEMPOTENT_WRITE = "IdempotentWrite"


OPERATION_CODES: dict[Operation, int] = {
    Operation.READ: 3, Operation.WRITE: 4, Operation.CREATE: 5, Operation.DELETE: 6,
    Operation.ALTER: 7, Operation.DESCRIBE: 8, Operation.CLUSTER_ACTION: 9,
    Operation.DESCRIBE_CONFIGS: 10, Operation.ALTER_CONFIGS: 11,
    Operation.IDEMPOTENT_WRITE: 12,
}
"""Kafka's AclOperation code of each operation (its bit in an authorized-operations field)."""


class ResourceType(Enum):
    """Kinds of resources an operation applies to."""

    TOPIC = "Topic"
    GROUP = "Group"
    CLUSTER = "Cluster"
    TRANSACTIONAL_ID = "TransactionalId"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An advertised address: what clients are told to connect to."""

    host: str
    port: int


@dataclass(frozen=True, slots=True)
class RequestContext:
    """One request's caller: its listener, advertised endpoint, principal and namespace.

    ``login_tenant`` is the tenant of a SASL login (None for anonymous and certificate
    principals); the tenant boundary is drawn around it.
    """

    listener: str
    advertised: Endpoint
    principal: str
    home: Namespace
    client_id: str | None
    api_version: int
    client_host: str = ""
    login_tenant: str | None = None
    api: str = ""

    def who(self) -> dict[str, str | None]:
        """The caller as the fields of a log line (``common.log_fields``): its tenant,
        principal, client address, client id and listener."""
        return {"tenant": self.home.tenant, "principal": self.principal,
                "client": self.client_host or None, "client_id": self.client_id,
                "listener": self.listener}


class Authorizer(Protocol):
    """Decides whether a principal may apply an operation to a resource."""

    def authorize(
        self, ctx: RequestContext, operation: Operation, resource: ResourceType, name: str,
        log_denied: bool = True,
    ) -> bool:
        """Return True when allowed. ``name`` is a full internal name for topics. A denial
        is reported (audit) unless ``log_denied`` is False: a question, such as which
        operations a caller may apply, is not an attempt (Kafka's ``logIfDenied``)."""
        ...

    def authorize_any(self, ctx: RequestContext, operation: Operation,
                      resource: ResourceType) -> bool:
        """Whether the caller may apply ``operation`` to some resource of the type (Kafka's
        ``authorizeByResourceType``: an ALLOW that no DENY takes back); nothing is
        reported."""
        ...

    def is_operator(self, ctx: RequestContext) -> bool:
        """Whether the caller acts for the broker's operator rather than for one tenant (a
        superuser, or a connection without a tenant login): it may see where the storage
        lives, which a tenant's login is never shown."""
        ...


class AllowAll:
    """The authorizer used when authorization is disabled: everything is allowed."""

    def authorize(
        self, ctx: RequestContext, operation: Operation, resource: ResourceType, name: str,
        log_denied: bool = True,
    ) -> bool:
        """Allow every operation."""
        return True

    def authorize_any(self, ctx: RequestContext, operation: Operation,
                      resource: ResourceType) -> bool:
        """Allow every operation."""
        return True

    def is_operator(self, ctx: RequestContext) -> bool:
        """No superusers: a connection without a tenant login."""
        return ctx.login_tenant is None
