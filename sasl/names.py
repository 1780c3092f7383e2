"""The rule for tenant, namespace and topic name parts, and the SASL username that names a
tenant.

A part is ASCII letters, digits, ``.``, ``_`` and ``-``, and is neither ``.`` nor
``..``. This module is the one home of that rule: logins check the tenant and namespace
they name with it, and ``broker_core.naming`` checks each part of a topic name with it
(it holds no SASL logic, so the engine may import it without knowing about SASL).
"""

from __future__ import annotations

import re

from sasl.errors import SaslFailure

_NAME_PART = re.compile(r"[A-Za-z0-9._-]+")
NAME_RULE = "ASCII letters, digits, '.', '_' and '-' (not '.' or '..')"
"""The rule, as messages state it."""


def is_valid_name(part: str) -> bool:
    """True if ``part`` is a non-empty name part of allowed characters, not ``.``/``..``."""
    return part not in (".", "..") and _NAME_PART.fullmatch(part) is not None


def claimed_tenant(username: str) -> str:
    """The tenant a username names (its part before any ``/``), valid or not."""
    return username.split("/", 1)[0]


def parse_tenant_spec(username: str) -> tuple[str, str | None]:
    """Split a username ``tenant`` or ``tenant/namespace``; raise SaslFailure if malformed."""
    parts = username.split("/")
    if len(parts) > 2 or not all(is_valid_name(part) for part in parts):
        raise SaslFailure(
            f"invalid username: expected 'tenant' or 'tenant/namespace', each of {NAME_RULE}"
        )
    return parts[0], parts[1] if len(parts) == 2 else None
