"""Quota entities and the precedence that picks the one quota applying to a caller.

An entity is a set of ``(type, name)`` parts, as in Kafka's client-quota APIs; a name of
None is the type's default (``<default>``). Kafka's types are ``user`` (the principal) and
``client-id``, alone or together; ours add ``tenant`` (a tenant's name) and ``namespace``
(``tenant/namespace``), each alone. For every quota key the most specific entity holding
a value wins, in Kafka's order for users and client ids, then the caller's namespace,
then its tenant, then the broker's configured per-tenant default:

 1. user + client-id            5. default user + default client-id
 2. user + default client-id    6. default user
 3. user                        7. client-id
 4. default user + client-id    8. default client-id
 9. namespace   10. default namespace   11. tenant   12. default tenant   13. config

The level that matched also says who shares the measured rate (Kafka's quota metric
tags): a ``user`` quota is shared by all the user's clients, a ``default user`` quota is
one per user, a tenant quota one per tenant, and so on.

The tenant's own level (11-13, the operator's) is also a ceiling: a caller whose most
specific quota is another level is measured against both, the tenant's over the whole
tenant's traffic, so a tenant admin's namespace quota can never lift the tenant's cap.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from common.names import TENANT_NAME_RULE, is_valid_tenant_name

USER = "user"
CLIENT_ID = "client-id"
TENANT = "tenant"
NAMESPACE = "namespace"
IP = "ip"
ENTITY_TYPES = (USER, CLIENT_ID, TENANT, NAMESPACE, IP)

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONNECTION_CREATION_RATE = "connection_creation_rate"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
"""KIP-599: partitions created (CreateTopics, CreatePartitions) or deleted (DeleteTopics)
per second (``broker_core.quotas.mutations``)."""
MAX_CONNECTIONS = "max_connections"
MAX_TOPICS = "max_topics"
MAX_PARTITIONS = "max_partitions"
MAX_STORED_BYTES = "max_stored_bytes"
TENANT_CAPS = (MAX_CONNECTIONS, MAX_TOPICS, MAX_PARTITIONS, MAX_STORED_BYTES)
"""Limits of a whole tenant (not rates): set on ``tenant`` entities (or their default) only."""
QUOTA_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE,
              CONNECTION_CREATION_RATE, CONTROLLER_MUTATION_RATE, *TENANT_CAPS)
WHOLE_KEYS = frozenset({PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, *TENANT_CAPS})
"""Keys whose values are whole numbers (Kafka declares the byte rates as longs)."""

_COMBINATIONS = (frozenset({USER}), frozenset({CLIENT_ID}), frozenset({USER, CLIENT_ID}),
                 frozenset({TENANT}), frozenset({NAMESPACE}), frozenset({IP}))

Part = tuple[str, str | None]


class EntityError(ValueError):
    """An entity or value a client may not name (answered INVALID_REQUEST)."""


@dataclass(frozen=True, slots=True)
class QuotaEntity:
    """One quota entity: its parts sorted by type."""

    parts: tuple[Part, ...]

    @classmethod
    def of(cls, parts: Iterable[Part]) -> QuotaEntity:
        """The entity of ``parts`` (any order), checked: known types, each once, a
        combination Kafka (or a tenant) allows, valid tenant and namespace names."""
        listed = list(parts)
        types = [kind for kind, _ in listed]
        if len(set(types)) != len(types):
            raise EntityError(f"duplicate entity type in {types}")
        for kind, name in listed:
            if kind not in ENTITY_TYPES:
                raise EntityError(f"unknown entity type {kind!r}")
            _check_name(kind, name)
        if frozenset(types) not in _COMBINATIONS:
            raise EntityError(f"invalid quota entity combination {sorted(types)}")
        return cls(tuple(sorted(listed, key=lambda part: ENTITY_TYPES.index(part[0]))))

    def sort_key(self) -> tuple[tuple[str, bool, str], ...]:
        """A stable order of entities (a default before the names of its type)."""
        return tuple((kind, name is not None, name or "") for kind, name in self.parts)

    def get(self, kind: str) -> tuple[bool, str | None]:
        """Whether the entity has a part of ``kind``, and its name."""
        for have, name in self.parts:
            if have == kind:
                return True, name
        return False, None

    @property
    def tenant(self) -> str | None:
        """The tenant this entity lies in (None: it is not a tenant's)."""
        for kind, name in self.parts:
            if kind in (TENANT, NAMESPACE) and name is not None:
                return name.split("/", 1)[0]
        return None


def _check_name(kind: str, name: str | None) -> None:
    if name is None:
        return
    if kind == TENANT and not is_valid_tenant_name(name):
        raise EntityError(f"tenant {name[:100]!r} is not a valid name "
                          f"({TENANT_NAME_RULE})")
    if kind == IP:
        try:
            ipaddress.ip_address(name)
        except ValueError:
            raise EntityError(f"{name!r} is not an IP address") from None
    if kind == NAMESPACE:
        pieces = name.split("/")
        if len(pieces) != 2 or not all(is_valid_tenant_name(p) for p in pieces):
            raise EntityError(f"namespace {name[:100]!r} must be 'tenant/namespace', "
                              f"each of {TENANT_NAME_RULE}")


def check_value(entity: QuotaEntity, key: str, value: float) -> None:
    """Refuse an unknown key, a key the entity cannot hold (an ``ip`` entity holds only
    ``connection_creation_rate``, as in Kafka; the tenant caps only ``tenant`` entities
    hold) or a value no quota can have (EntityError)."""
    if key not in QUOTA_KEYS:
        raise EntityError(f"unknown quota key {key!r}")
    kinds = {kind for kind, _ in entity.parts}
    if IP in kinds and key != CONNECTION_CREATION_RATE:
        raise EntityError(f"only {CONNECTION_CREATION_RATE} can be set for an ip entity, "
                          f"not {key}")
    if key in TENANT_CAPS and kinds != {TENANT}:
        raise EntityError(f"{key} can be set for a tenant entity only")
    if not value > 0 or value == float("inf"):
        raise EntityError(f"{key} must be a positive number, not {value}")
    if key in WHOLE_KEYS and value != int(value):
        raise EntityError(f"{key} must be a whole number of bytes per second, not {value}")


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request comes from, as quotas see it."""

    user: str
    client_id: str
    tenant: str
    namespace: str  # tenant/namespace


@dataclass(frozen=True, slots=True)
class Applied:
    """The quota applying to a caller for one key: its value and who shares the rate."""

    value: float
    shared_by: tuple[str, ...]


def ip_value(quotas: Mapping[QuotaEntity, Mapping[str, float]], ip: str) -> float | None:
    """The ``connection_creation_rate`` of connections from ``ip``: its own ip quota, else
    the default ip quota's (Kafka's order)."""
    for entity in (QuotaEntity(((IP, ip),)), QuotaEntity(((IP, None),))):
        value = (quotas.get(entity) or {}).get(CONNECTION_CREATION_RATE)
        if value is not None:
            return value
    return None


def _candidates(who: Caller) -> list[tuple[QuotaEntity, tuple[str, ...]]]:
    """Levels 1-10, most specific first, with who shares each (the tenant's own levels
    are :func:`tenant_values`)."""
    u, c = who.user, who.client_id
    e = QuotaEntity
    return [
        (e(((USER, u), (CLIENT_ID, c))), (USER, u, CLIENT_ID, c)),
        (e(((USER, u), (CLIENT_ID, None))), (USER, u, CLIENT_ID, c)),
        (e(((USER, u),)), (USER, u)),
        (e(((USER, None), (CLIENT_ID, c))), (USER, u, CLIENT_ID, c)),
        (e(((USER, None), (CLIENT_ID, None))), (USER, u, CLIENT_ID, c)),
        (e(((USER, None),)), (USER, u)),
        (e(((CLIENT_ID, c),)), (CLIENT_ID, c)),
        (e(((CLIENT_ID, None),)), (CLIENT_ID, c)),
        (e(((NAMESPACE, who.namespace),)), (NAMESPACE, who.namespace)),
        (e(((NAMESPACE, None),)), (NAMESPACE, who.namespace)),
    ]


def tenant_values(quotas: Mapping[QuotaEntity, Mapping[str, float]], tenant: str,
                  defaults: Mapping[str, float]) -> dict[str, float]:
    """The tenant's own value of each key: its tenant quota, else the default tenant's,
    else the configured ``defaults`` (levels 11-13, all the operator's)."""
    found = dict(defaults)
    for entity in (QuotaEntity(((TENANT, None),)), QuotaEntity(((TENANT, tenant),))):
        found.update(quotas.get(entity) or {})
    return found


def resolve(quotas: Mapping[QuotaEntity, Mapping[str, float]], who: Caller,
            defaults: Mapping[str, float]) -> dict[str, tuple[Applied, ...]]:
    """The quotas applying to ``who`` for each key that has one (``defaults``: the
    configured per-tenant values, the last level): the most specific, then the tenant's
    own value as a ceiling when that is not the one already."""
    specific: dict[str, Applied] = {}
    if quotas:
        for entity, shared_by in _candidates(who):
            values = quotas.get(entity)
            if values:
                for key, value in values.items():
                    specific.setdefault(key, Applied(value, shared_by))
    tenant = (TENANT, who.tenant)
    found: dict[str, tuple[Applied, ...]] = {
        key: (applied,) for key, applied in specific.items()}
    for key, value in tenant_values(quotas, who.tenant, defaults).items():
        found[key] = (*found.get(key, ()), Applied(value, tenant))
    return found
