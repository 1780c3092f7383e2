"""Rules for tenant and namespace names carried in SASL usernames and extensions."""

from __future__ import annotations

import re

from sasl.errors import SaslFailure

_NAME_PART = re.compile(r"[A-Za-z0-9\-_=:.]+")


def is_valid_name(part: str) -> bool:
    """True if ``part`` is a non-empty tenant or namespace name of allowed characters."""
    return _NAME_PART.fullmatch(part) is not None


def parse_tenant_spec(username: str) -> tuple[str, str | None]:
    """Split a username ``tenant`` or ``tenant/namespace``; raise SaslFailure if malformed."""
    parts = username.split("/")
    if len(parts) > 2 or not all(is_valid_name(part) for part in parts):
        raise SaslFailure(
            "invalid username: expected 'tenant' or 'tenant/namespace' using letters, "
            "digits and '-_=:.'"
        )
    return parts[0], parts[1] if len(parts) == 2 else None
