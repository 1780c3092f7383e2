"""Pulsar-style JWT validation (``tokenSecretKey`` / ``tokenPublicKey`` and friends).

A validator built from :class:`TokenSettings` checks the signature with a fixed set of
algorithms chosen by the key (HMAC for a secret, RSA/RSASSA-PSS or ECDSA for a public
key), ``exp`` (required unless ``require_exp`` is off) and ``nbf`` when present, the
lifetime when a maximum is set, and the audience when configured, then takes the role
from the configured claim.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import jwt
from cryptography.hazmat.primitives.asymmetric import ec

from common.json_types import JsonObject, JsonValue
from oauth.errors import TokenInvalid
from oauth.jwt_checks import decode_verified
from oauth.keys import PublicKey, load_public_key, load_secret_key
from sasl.types import ValidatedToken

HMAC_ALGORITHMS: tuple[str, ...] = ("HS256", "HS384", "HS512")
RSA_ALGORITHMS: tuple[str, ...] = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
EC_ALGORITHMS: Mapping[str, str] = {
    "secp256r1": "ES256",
    "secp384r1": "ES384",
    "secp521r1": "ES512",
}
"""The ECDSA algorithm of each curve a token key may be on."""


@dataclass(frozen=True)
class TokenSettings:
    """How to validate tokens; exactly one of ``secret_key`` / ``public_key`` (key URLs)."""

    secret_key: str | None = None
    public_key: str | None = None
    auth_claim: str = "sub"
    audience_claim: str | None = None
    """The claim holding the audience; ``aud`` when ``audience`` is set and this is not."""
    audience: str | None = None
    leeway_seconds: int = 0
    require_exp: bool = False
    """Refuse a token without ``exp`` (else such a token never expires). The broker
    turns it on by default (its ``tokenExpiration`` key); a bare validator checks only
    what the token says."""
    max_lifetime_seconds: int = 0
    """Refuse a token living longer (see ``jwt_checks.check_lifetime``); 0 = no limit."""
    missing_exp_hint: str = ""
    """What the refusal of a token without ``exp`` (by ``require_exp``) adds in
    parentheses: the broker names the setting that accepts such tokens."""

    def __post_init__(self) -> None:
        if (self.secret_key is None) == (self.public_key is None):
            raise ValueError("exactly one of the token secret key and public key must be set")
        if not self.auth_claim:
            raise ValueError("the token auth claim must not be empty")
        if self.leeway_seconds < 0:
            raise ValueError("the token leeway must not be negative")
        if self.audience is not None and not self.audience:
            raise ValueError("the token audience must not be empty")
        if self.max_lifetime_seconds < 0:
            raise ValueError("the token maximum lifetime must not be negative")

    @property
    def effective_audience_claim(self) -> str:
        """The claim the audience is read from."""
        return self.audience_claim or "aud"


def _algorithms_for(key: PublicKey) -> tuple[str, ...]:
    if isinstance(key, ec.EllipticCurvePublicKey):
        alg = EC_ALGORITHMS.get(key.curve.name)
        if alg is None:
            raise ValueError(f"unsupported EC curve {key.curve.name!r} for token keys")
        return (alg,)
    return RSA_ALGORITHMS


def _header_algorithm(token: str) -> str:
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        raise TokenInvalid("malformed token") from None
    alg = header.get("alg")
    if not isinstance(alg, str):
        raise TokenInvalid("malformed token")
    return alg


def _expiry_ms(claims: Mapping[str, JsonValue]) -> int | None:
    exp = claims.get("exp")
    if exp is None:
        return None
    if isinstance(exp, bool) or not isinstance(exp, int | float):
        raise TokenInvalid("malformed token")
    return int(exp * 1000)


class JwtTokenValidator:
    """Validates JWTs with an HMAC secret or a public key; implements TokenValidator."""

    def __init__(self, settings: TokenSettings) -> None:
        self.settings = settings
        self._key: bytes | PublicKey
        if settings.secret_key is not None:
            self._key = load_secret_key(settings.secret_key)
            self._algorithms = HMAC_ALGORITHMS
        else:
            assert settings.public_key is not None
            public = load_public_key(settings.public_key)
            self._key = public
            self._algorithms = _algorithms_for(public)

    @property
    def algorithms(self) -> tuple[str, ...]:
        """The signature algorithms this validator accepts."""
        return self._algorithms

    def validate(self, token: str) -> ValidatedToken:
        if not token:
            raise TokenInvalid("malformed token")
        try:
            claims = self._decode(token)
        except TokenInvalid:
            refusal = self._header_refusal(token)
            if refusal is not None:
                raise refusal from None
            raise
        self._check_audience(claims)
        principal = claims.get(self.settings.auth_claim)
        if not isinstance(principal, str) or not principal:
            raise TokenInvalid(f"token has no {self.settings.auth_claim!r} claim")
        return ValidatedToken(
            principal=principal,
            expires_at_ms=_expiry_ms(claims),
            claims=MappingProxyType(claims),
        )

    def _header_refusal(self, token: str) -> TokenInvalid | None:
        """Why the token's header is refused (a malformed token, an algorithm not
        allowed), which takes precedence over what else is wrong with it; None if it is
        not. Asked only of a token refused: one that decodes has an allowed algorithm, so
        an accepted token is parsed once (pyjwt's parse, which looks at every character
        in Python, was a third of a login's token check when the header was read first)."""
        try:
            alg = _header_algorithm(token)
        except TokenInvalid as malformed:
            return malformed
        if alg.lower() == "none":
            return TokenInvalid("token algorithm 'none' not allowed")
        if alg not in self._algorithms:
            return TokenInvalid(f"token algorithm {alg[:16]!r} not allowed")
        return None

    def _decode(self, token: str) -> JsonObject:
        settings = self.settings
        claims = decode_verified(token, self._key, self._algorithms,
                                 leeway=settings.leeway_seconds,
                                 max_lifetime_seconds=settings.max_lifetime_seconds)
        if settings.require_exp and "exp" not in claims:
            hint = f" ({settings.missing_exp_hint})" if settings.missing_exp_hint else ""
            raise TokenInvalid(f"token has no 'exp' claim{hint}")
        return claims

    def _check_audience(self, claims: Mapping[str, JsonValue]) -> None:
        audience = self.settings.audience
        if audience is None:
            return
        value = claims.get(self.settings.effective_audience_claim)
        if isinstance(value, str):
            ok = value == audience
        elif isinstance(value, list):
            ok = audience in value
        else:
            ok = False
        if not ok:
            raise TokenInvalid("token audience mismatch")
