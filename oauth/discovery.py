"""OpenID Connect discovery: ``<issuer>/.well-known/openid-configuration`` gives the
issuer's ``jwks_uri`` and ``token_endpoint``.

The document's ``issuer`` must equal the issuer asked for (OpenID Connect Discovery 1.0,
section 4.3), so that a token's ``iss`` can be compared with the configured value. The
URLs it names may not be weaker than the issuer's: an ``https`` issuer naming an ``http``
``jwks_uri`` or ``token_endpoint`` (keys or client secrets in clear) is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from oauth.errors import FetchError
from oauth.http import check_http_url, get_json_object

WELL_KNOWN_PATH = "/.well-known/openid-configuration"


@dataclass(frozen=True)
class ProviderMetadata:
    """The parts of an issuer's discovery document that we use."""

    issuer: str
    jwks_uri: str | None
    token_endpoint: str | None
    token_endpoint_auth_methods: tuple[str, ...]
    """``token_endpoint_auth_methods_supported``; empty when not stated."""


def discovery_url(issuer: str) -> str:
    """The discovery document's URL for ``issuer``."""
    return issuer.rstrip("/") + WELL_KNOWN_PATH


def _optional_url(document: Mapping[str, object], name: str, where: str,
                  issuer: str) -> str | None:
    value = document.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise FetchError(f"{where}: {name!r} is not a string")
    try:
        url = check_http_url(value, f"{where}: {name!r}")
    except ValueError as exc:
        raise FetchError(str(exc)) from None
    if urlsplit(issuer).scheme.lower() == "https" and urlsplit(url).scheme.lower() != "https":
        raise FetchError(f"{where}: {name!r} is {url!r}, not https like the issuer")
    return url


def discover(issuer: str, *, timeout: float) -> ProviderMetadata:
    """Fetch and check the discovery document of ``issuer``; raise FetchError."""
    url = discovery_url(issuer)
    document = get_json_object(url, timeout=timeout)
    stated = document.get("issuer")
    if stated != issuer:
        raise FetchError(f"{url} names issuer {stated!r}, expected {issuer!r}")
    methods = document.get("token_endpoint_auth_methods_supported")
    return ProviderMetadata(
        issuer=issuer,
        jwks_uri=_optional_url(document, "jwks_uri", url, issuer),
        token_endpoint=_optional_url(document, "token_endpoint", url, issuer),
        token_endpoint_auth_methods=tuple(m for m in methods if isinstance(m, str))
        if isinstance(methods, list) else (),
    )
