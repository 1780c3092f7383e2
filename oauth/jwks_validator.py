"""The OAUTHBEARER server callback: checks an issuer's access tokens (JWTs) against its
published keys (JWKS, found by OIDC discovery or configured).

A token passes when its header names an allowed asymmetric algorithm and a key of the
issuer, the signature verifies, ``exp`` is present and not past and ``nbf`` not ahead
(both with the configured clock skew), the lifetime is within the maximum (when one is
set), ``iss`` equals the issuer (when one is
configured), ``aud`` holds a configured audience, the required scopes are all granted,
and the principal claim is a non-empty string. Nothing is fetched at construction: the
keys come from :meth:`JwksTokenValidator.warm_up` (or the first login), in the background,
so a broker starts while its issuer is down, and logins work once the issuer is back;
``oauth.jwks`` says when they are fetched again.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import jwt

from common.json_types import JsonObject, JsonValue, json_number
from oauth.discovery import discover
from oauth.errors import FetchError, TokenInvalid
from oauth.http import get_json_object
from oauth.jwks import JwksCache
from oauth.jwt_checks import decode_verified
from oauth.keys import PublicKey
from oauth.settings import ValidatorSettings
from sasl.types import ValidatedToken

FETCH_REQUESTS = 2
"""HTTP requests of one fetch at most (discovery, then the JWKS), each within
``oauth.http.timeout.seconds``."""


class IssuerKeysLoader:
    """Fetches the JWKS document, discovering ``jwks_uri`` first when it is not configured."""

    def __init__(self, settings: ValidatorSettings) -> None:
        self._issuer = settings.issuer_url
        self._jwks_uri = settings.jwks_url
        self._timeout = settings.http_timeout_seconds

    def __call__(self) -> JsonObject:
        if self._jwks_uri is None:
            assert self._issuer is not None
            metadata = discover(self._issuer, timeout=self._timeout)
            if metadata.jwks_uri is None:
                raise FetchError(f"issuer {self._issuer} publishes no 'jwks_uri'")
            self._jwks_uri = metadata.jwks_uri
        return get_json_object(self._jwks_uri, timeout=self._timeout)


def granted_scopes(claims: Mapping[str, JsonValue]) -> set[str]:
    """The scopes of a token: ``scope`` (space-separated string) and ``scp`` (list/string)."""
    granted: set[str] = set()
    for name in ("scope", "scp"):
        value = claims.get(name)
        if isinstance(value, str):
            granted.update(value.split())
        elif isinstance(value, list):
            granted.update(v for v in value if isinstance(v, str))
    return granted


def _header(token: str) -> tuple[str, str | None]:
    try:
        header = jwt.get_unverified_header(token)
    except (jwt.PyJWTError, ValueError, TypeError):
        raise TokenInvalid("malformed token") from None
    alg, kid = header.get("alg"), header.get("kid")
    if not isinstance(alg, str) or (kid is not None and not isinstance(kid, str)):
        raise TokenInvalid("malformed token")
    return alg, kid


class JwksTokenValidator:
    """Validates access tokens with the issuer's JWKS; implements ``sasl.TokenValidator``."""

    def __init__(self, settings: ValidatorSettings, keys: JwksCache | None = None) -> None:
        if settings.issuer_url is None and settings.jwks_url is None:
            raise ValueError("an issuer URL or a JWKS URL is required")
        self.settings = settings
        self.keys = keys or JwksCache(
            IssuerKeysLoader(settings),
            refresh_min_seconds=settings.jwks_refresh_min_seconds,
            retry_seconds=settings.jwks_retry_seconds,
            max_age_seconds=settings.jwks_max_age_seconds,
            first_wait_seconds=FETCH_REQUESTS * settings.http_timeout_seconds,
        )

    def warm_up(self) -> None:
        """Start fetching the keys in the background (start-up does not wait for the
        issuer)."""
        self.keys.warm_up()

    @property
    def keys_generation(self) -> int:
        """Changes whenever a new key set is taken (see ``sasl.token_cache``)."""
        return self.keys.generation

    def validate(self, token: str) -> ValidatedToken:
        alg, kid = _header(token)
        if alg not in self.settings.algorithms:
            raise TokenInvalid(f"token algorithm {alg[:16]!r} not allowed")
        claims, exp = self._decode(token, self.keys.key(kid, alg), alg)
        self._check_claims(claims)
        principal = claims.get(self.settings.principal_claim)
        if not isinstance(principal, str) or not principal:
            raise TokenInvalid(f"token has no {self.settings.principal_claim!r} claim")
        return ValidatedToken(principal=principal, expires_at_ms=int(exp * 1000),
                              claims=MappingProxyType(claims))

    def _decode(self, token: str, key: PublicKey, alg: str) -> tuple[JsonObject, float]:
        claims = decode_verified(token, key, [alg], leeway=self.settings.clock_skew_seconds,
                                 require=["exp"],
                                 max_lifetime_seconds=self.settings.max_lifetime_seconds)
        exp = json_number(claims.get("exp"))
        if exp is None:
            raise TokenInvalid("malformed token")
        return claims, exp

    def _check_claims(self, claims: Mapping[str, JsonValue]) -> None:
        settings = self.settings
        if settings.issuer_url is not None and claims.get("iss") != settings.issuer_url:
            raise TokenInvalid("token issuer mismatch")
        if settings.audiences:
            aud = claims.get("aud")
            items = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
            held = {a for a in items if isinstance(a, str)}
            if held.isdisjoint(settings.audiences):
                raise TokenInvalid("token audience mismatch")
        missing = [s for s in settings.required_scopes if s not in granted_scopes(claims)]
        if missing:
            raise TokenInvalid(f"token lacks required scope {' '.join(missing)!r}")
