"""Client credentials for the login callback, read from a credentials URL as KoP reads
``oauth.credentials.url``: ``file:///path``, ``file:/path``, a plain path, or
``data:application/json;base64,<json>``.

The JSON object holds ``client_id`` and ``client_secret`` and optionally ``tenant`` and
``group_id``, which the Kafka client adapters send as the SASL extensions ``tenant`` and
``groupId``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from oauth.keys import load_key_material

TENANT_EXTENSION = "tenant"
GROUP_ID_EXTENSION = "groupId"


@dataclass(frozen=True)
class ClientCredentials:
    """An OAuth client's id and secret, plus the tenant and group it logs in for."""

    client_id: str
    client_secret: str
    tenant: str | None = None
    group_id: str | None = None

    def __repr__(self) -> str:
        return (f"ClientCredentials(client_id={self.client_id!r}, client_secret='***', "
                f"tenant={self.tenant!r}, group_id={self.group_id!r})")

    def extensions(self) -> dict[str, str]:
        """The SASL/OAUTHBEARER extensions to send: ``tenant`` and ``groupId`` when set."""
        found = {TENANT_EXTENSION: self.tenant, GROUP_ID_EXTENSION: self.group_id}
        return {key: value for key, value in found.items() if value}


def _field(document: dict[str, object], name: str, required: bool, where: str) -> str | None:
    value = document.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        need = "a non-empty string" if required else "a string"
        raise ValueError(f"credentials {where}: {name!r} must be {need}")
    return value


def parse_credentials(data: bytes, where: str = "<bytes>") -> ClientCredentials:
    """Parse a credentials JSON document; raise ValueError naming the bad field."""
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(f"credentials {where} are not JSON") from None
    if not isinstance(document, dict):
        raise ValueError(f"credentials {where} are not a JSON object")
    client_id = _field(document, "client_id", True, where)
    secret = _field(document, "client_secret", True, where)
    assert client_id is not None and secret is not None
    return ClientCredentials(client_id, secret, _field(document, "tenant", False, where),
                             _field(document, "group_id", False, where))


def load_credentials(url: str) -> ClientCredentials:
    """Read credentials from a ``file:``/``data:`` URL or a path; raise ValueError."""
    shown = url if not url.lower().startswith("data:") else "data:..."
    try:
        data = load_key_material(url)
    except ValueError as exc:
        raise ValueError(f"cannot read credentials {shown}: {exc}") from None
    return parse_credentials(data, shown)
