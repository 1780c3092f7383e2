"""Kafka's ACL model and the broker's persisted ACL store.

A binding grants or denies one operation on a resource pattern (LITERAL, PREFIXED, or the
LITERAL wildcard ``*``) to a principal ``User:<role>`` (or ``User:*``) from a host (or
``*``). Every binding belongs to a tenant: it only ever applies to that tenant's
resources, so the tenant boundary holds whatever the ACLs say. Topic names are stored as
full ``tenant/namespace/topic`` names; a namespace grant is the PREFIXED binding
``tenant/namespace/``. DENY beats ALLOW.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from enum import IntEnum

from broker_core.kv_document import KvDocument
from broker_core.storage import KeyValueStore

KEY = "acls.json"
"""The ACLs' key in the storage's key-value area."""


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


def _parse(stored: bytes | None) -> frozenset[AclBinding]:
    if stored is None:
        return frozenset()
    return frozenset(AclBinding(
        item["tenant"], AclResource(item["resource"]), item["name"],
        AclPattern(item["pattern"]), item["principal"], item["host"],
        AclOperation(item["operation"]), AclPermission(item["permission"]))
        for item in json.loads(stored))


def _encode(bindings: Iterable[AclBinding]) -> bytes:
    document = sorted((asdict(b) for b in bindings), key=lambda d: json.dumps(d, sort_keys=True))
    return json.dumps(document, indent=1).encode()


class AclStore:
    """The ACL bindings, kept as JSON under ``acls.json`` in the storage's key-value area
    (a :class:`~broker_core.kv_document.KvDocument`: changes by compare-and-set, so no
    change is lost; :meth:`read_again` takes in other brokers' changes)."""

    def __init__(self, kv: KeyValueStore) -> None:
        self.document = KvDocument(kv, KEY, _parse, _encode)

    @property
    def bindings(self) -> frozenset[AclBinding]:
        """The bindings as last read or written."""
        return self.document.value

    def read_again(self) -> None:
        """Take in the stored bindings if another broker changed them."""
        self.document.read_again()

    def _change(self, edit: Callable[[frozenset[AclBinding]], frozenset[AclBinding]]) -> None:
        """Store ``edit`` of the current bindings (the stored ones, whoever wrote them)."""
        self.document.change(edit)

    def add(self, bindings: Iterable[AclBinding]) -> None:
        """Add bindings (adding an existing one changes nothing)."""
        added = frozenset(bindings)
        self._change(lambda current: current | added)

    def find(self, selector: AclFilter) -> list[AclBinding]:
        """Bindings selected by the filter, in a stable order."""
        return self._sorted(b for b in self.bindings if selector.matches(b))

    @staticmethod
    def _sorted(bindings: Iterable[AclBinding]) -> list[AclBinding]:
        return sorted(bindings, key=lambda b: (b.resource, b.name, b.pattern, b.principal,
                                               b.host, b.operation, b.permission))

    def delete(self, selector: AclFilter) -> list[AclBinding]:
        """Remove and return the bindings selected by the filter."""
        doomed: list[AclBinding] = []

        def without(current: frozenset[AclBinding]) -> frozenset[AclBinding]:
            doomed[:] = [b for b in current if selector.matches(b)]
            return current.difference(doomed)
        self._change(without)
        return self._sorted(doomed)

    def allows_something(self, tenant: str, principal: str, host: str) -> bool:
        """Whether any ALLOW binding of ``tenant`` (any resource, operation or pattern)
        applies to ``principal`` from ``host``: what a login to the tenant needs. Read from
        the bindings as they stand (no cache), so a change applies to the next login."""
        return any(
            b.tenant == tenant and b.permission == AclPermission.ALLOW
            and b.principal in (principal, "User:*") and b.host in (host, WILDCARD)
            for b in self.bindings)

    def decide_any(self, tenant: str | None, resource: AclResource, principal: str,
                   host: str, operation: AclOperation) -> bool:
        """Kafka's ``authorizeByResourceType``: whether some resource of the type (of
        ``tenant``; None: of any tenant) may get ``operation``: an ALLOW binding that no
        DENY covers (a DENY of the wildcard, or of a prefix of the ALLOW's name, or of the
        very name of a LITERAL ALLOW)."""
        allows: list[AclBinding] = []
        denies: list[AclBinding] = []
        for binding in self.bindings:
            if (tenant is not None and binding.tenant != tenant) or \
                    binding.resource != resource:
                continue
            if binding.principal not in (principal, "User:*") or \
                    binding.host not in (host, WILDCARD):
                continue
            if binding.operation not in (AclOperation.ALL, operation):
                continue
            (denies if binding.permission == AclPermission.DENY else allows).append(binding)

        def taken_back(allow: AclBinding) -> bool:
            return any(
                deny.tenant == allow.tenant and (
                    (deny.pattern == AclPattern.LITERAL and deny.name == WILDCARD)
                    or (deny.pattern == AclPattern.PREFIXED and allow.name.startswith(deny.name))
                    or (deny.pattern == allow.pattern == AclPattern.LITERAL
                        and deny.name == allow.name))
                for deny in denies)
        return any(not taken_back(allow) for allow in allows)

    def decide(self, tenant: str, resource: AclResource, name: str, principal: str,
               host: str, operation: AclOperation) -> bool:
        """Kafka's rule: any matching DENY refuses; else any matching ALLOW grants."""
        allowed = False
        for binding in self.bindings:
            if binding.tenant != tenant or binding.resource != resource:
                continue
            if binding.principal not in (principal, "User:*") or \
                    binding.host not in (host, WILDCARD):
                continue
            if not binding.covers(name) or not binding.grants(operation):
                continue
            if binding.permission == AclPermission.DENY:
                return False
            allowed = True
        return allowed
