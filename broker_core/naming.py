"""Topic names as Kafka-on-Pulsar maps them onto ``tenant/namespace/topic``.

``t`` lands in the login's tenant and namespace, ``a/b/t`` is already full, and
``persistent://a/b/t`` is the Pulsar spelling of the same; a two-part ``a/t`` is refused.
Responses give names back exactly as the client wrote them.
"""

from __future__ import annotations

import functools
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from broker_core.errors import ErrorCode, KafkaApiError
from common.names import MAX_TENANT_NAME_LENGTH, NAME_RULE, is_valid_name

_MAX_TOPIC_LENGTH = 249
_QUOTED = 100
"""How much of an over-long name an error message quotes."""
_PERSISTENT = "persistent://"


@dataclass(frozen=True, slots=True)
class Namespace:
    """A tenant and namespace pair: where short topic names of a login go."""

    tenant: str
    namespace: str

    @property
    def prefix(self) -> str:
        """``tenant/namespace/``, the prefix of every full topic name in this namespace."""
        return f"{self.tenant}/{self.namespace}/"


def _check_part(part: str, what: str, original: str, longest: int) -> None:
    if len(part) > longest:
        raise KafkaApiError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name {original[:_QUOTED]!r}... has a {what} longer than {longest} "
            "characters",
        )
    if not is_valid_name(part):
        which = "is invalid" if part == original else f"has an invalid {what} part {part!r}"
        raise KafkaApiError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name {original!r} {which}: use only {NAME_RULE}",
        )


def to_internal(name: str, home: Namespace) -> str:
    """Map a client's topic name to the full ``tenant/namespace/topic`` name used by storage."""
    return _mapped(name, home)


@functools.lru_cache(maxsize=4096)
def _mapped(name: str, home: Namespace) -> str:
    """:func:`to_internal`, remembered: every request naming a topic maps it, most more
    than once (a refused name raises, and is not remembered)."""
    if not name:
        raise KafkaApiError(ErrorCode.INVALID_TOPIC_EXCEPTION, "topic name is empty")
    body = name[len(_PERSISTENT) :] if name.startswith(_PERSISTENT) else name
    parts = body.split("/")
    if len(parts) == 1:
        parts = [home.tenant, home.namespace, parts[0]]
    elif len(parts) != 3:
        raise KafkaApiError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name {name!r} must be 'topic', 'tenant/namespace/topic' or "
            "'persistent://tenant/namespace/topic'",
        )
    _check_part(parts[0], "tenant", name, MAX_TENANT_NAME_LENGTH)
    _check_part(parts[1], "namespace", name, MAX_TENANT_NAME_LENGTH)
    _check_part(parts[2], "topic", name, _MAX_TOPIC_LENGTH)
    return "/".join(parts)


def in_system_namespace(name: str, metadata_namespace: str) -> bool:
    """Whether a full topic name (or a ``tenant/namespace…`` prefix of one) lies in a
    system namespace: any tenant's ``metadata_namespace`` (KoP's ``<tenant>/__kafka``),
    where the broker keeps its own topics (group offsets, transactions, audit events)."""
    parts = name.split("/")
    return len(parts) >= 2 and parts[1] == metadata_namespace


def to_client(internal: str, home: Namespace) -> str:
    """The name a client of ``home`` uses for an internal topic: short inside its namespace."""
    if internal.startswith(home.prefix):
        return internal[len(home.prefix) :]
    return internal


def named_in(internal: str, names: AbstractSet[str]) -> bool:
    """Whether one of ``names``, topic names clients sent from logins whose namespace is
    not known here (a consumer group's subscriptions), may mean the internal topic: its
    full name, its Pulsar spelling, or its short name (which means it to a login of its
    namespace; a login of another namespace means another topic by it, but which login
    sent it is not kept, so this errs toward "named")."""
    return (internal in names or _PERSISTENT + internal in names
            or internal.rsplit("/", 1)[-1] in names)
