"""The SASL username that names a tenant: ``tenant`` or ``tenant/namespace``.

Each part follows the shared name rule of ``common.names``; this module adds only what a
login needs (splitting the username, and refusing a malformed one with ``SaslFailure``).
"""

from __future__ import annotations

from common.names import TENANT_NAME_RULE, is_valid_tenant_name
from sasl.errors import SaslFailure


def claimed_tenant(username: str) -> str:
    """The tenant a username names (its part before any ``/``), valid or not."""
    return username.split("/", 1)[0]


def parse_tenant_spec(username: str, reserved_namespace: str | None = None
                      ) -> tuple[str, str | None]:
    """Split a username ``tenant`` or ``tenant/namespace``; raise SaslFailure if malformed
    or if it names ``reserved_namespace`` (the broker's own namespace, where no login's
    topics may go)."""
    parts = username.split("/")
    if len(parts) > 2 or not all(is_valid_tenant_name(part) for part in parts):
        raise SaslFailure(
            f"invalid username: expected 'tenant' or 'tenant/namespace', each of {TENANT_NAME_RULE}"
        )
    namespace = parts[1] if len(parts) == 2 else None
    if namespace is not None and namespace == reserved_namespace:
        raise SaslFailure(
            f"invalid username: namespace '{namespace}' holds the broker's own topics; "
            "name another namespace, or only the tenant"
        )
    return parts[0], namespace
