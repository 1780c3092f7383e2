"""Signing the tokens that PLAIN's ``token:`` passwords and OAUTHBEARER carry, as Pulsar's
``tokens create`` does: HS256 with the broker's secret key (``tokenSecretKey``), or RS256 /
ES256-512 with the private key matching ``tokenPublicKey``. The algorithm follows from the
key, by the same tables the validator checks against (``oauth.key_validator``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import jwt
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey

from oauth.key_validator import EC_ALGORITHMS, HMAC_ALGORITHMS, RSA_ALGORITHMS
from oauth.keys import PrivateKey

SigningKey = bytes | PrivateKey
"""An HMAC secret, or an RSA or EC private key."""


def signing_algorithm(key: SigningKey) -> str:
    """The algorithm a token signed with ``key`` carries."""
    if isinstance(key, bytes):
        return HMAC_ALGORITHMS[0]
    if isinstance(key, EllipticCurvePrivateKey):
        alg = EC_ALGORITHMS.get(key.curve.name)
        if alg is None:
            raise ValueError(f"unsupported EC curve {key.curve.name!r} for token keys")
        return alg
    return RSA_ALGORITHMS[0]


def sign_token(key: SigningKey, subject: str, lifetime_seconds: int | None,
               claims: Mapping[str, object] | None = None, *, subject_claim: str = "sub",
               clock: Callable[[], float] = time.time) -> str:
    """A JWT for ``subject`` (in ``subject_claim``), issued now, expiring after
    ``lifetime_seconds`` (None: no ``exp``), with the extra ``claims``."""
    if not subject:
        raise ValueError("the token subject must not be empty")
    now = int(clock())
    body: dict[str, object] = {**(claims or {}), subject_claim: subject, "iat": now}
    if lifetime_seconds is not None:
        body["exp"] = now + lifetime_seconds
    return jwt.encode(body, key, algorithm=signing_algorithm(key))
