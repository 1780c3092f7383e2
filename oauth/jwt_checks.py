"""Verifying a JWT's signature and time claims with pyjwt, with the short, clear messages
both validators give clients."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence

import jwt

from common.json_types import JsonObject, JsonValue
from oauth.errors import TokenInvalid
from oauth.keys import PublicKey

VerifyKey = bytes | PublicKey
"""What a signature is checked with: an HMAC secret or a public key."""
LATEST_TIME = 253_402_300_799
"""9999-12-31T23:59:59Z in seconds since the epoch: a time claim beyond it either way (or
not finite) makes a malformed token, so that every time computed from a token (an expiry
in milliseconds, a session lifetime) is a plain number that fits a Kafka int64."""
TIME_CLAIMS = ("exp", "nbf", "iat")


def decode_verified(token: str, key: VerifyKey, algorithms: Sequence[str], *, leeway: int,
                    require: Sequence[str] = (), max_lifetime_seconds: int = 0
                    ) -> JsonObject:
    """The token's claims once its signature, ``exp`` and ``nbf`` check out, every claim
    in ``require`` is present, and (with ``max_lifetime_seconds`` > 0) its lifetime is no
    longer than that.

    A time claim (``exp``, ``nbf``, ``iat``) that is a number must lie within
    :data:`LATEST_TIME` either way of the epoch. Audience, issuer and subject are the
    callers' business (their rules differ).
    """
    try:
        claims: JsonObject = jwt.decode(
            token, key, algorithms=list(algorithms),
            options={"verify_signature": True, "verify_exp": True, "verify_nbf": True,
                     "verify_iat": False, "verify_aud": False, "verify_iss": False,
                     "verify_sub": False, "verify_jti": False, "require": list(require)},
            leeway=leeway,
        )
    except jwt.ExpiredSignatureError:
        raise TokenInvalid("token expired") from None
    except jwt.ImmatureSignatureError:
        raise TokenInvalid("token not valid yet") from None
    except jwt.InvalidSignatureError:
        raise TokenInvalid("token signature invalid") from None
    except jwt.InvalidAlgorithmError:
        raise TokenInvalid("token algorithm not allowed") from None
    except jwt.MissingRequiredClaimError as missing:
        raise TokenInvalid(f"token has no {missing.claim!r} claim") from None
    except (jwt.PyJWTError, json.JSONDecodeError, ValueError, TypeError):
        raise TokenInvalid("malformed token") from None
    _check_times(claims)
    if max_lifetime_seconds > 0:
        check_lifetime(claims, max_lifetime_seconds, leeway)
    return claims


def _check_times(claims: Mapping[str, JsonValue]) -> None:
    for name in TIME_CLAIMS:
        value = claims.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue  # absent, or not a number: pyjwt's checks (or the caller's) say so
        if not -LATEST_TIME <= value <= LATEST_TIME:  # NaN too: it compares false
            raise TokenInvalid(f"malformed token: {name!r} is out of range (the year 9999 "
                               "at most)")


def _number(claims: Mapping[str, JsonValue], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TokenInvalid("malformed token")
    return float(value)


def check_lifetime(claims: Mapping[str, JsonValue], max_lifetime_seconds: int,
                   leeway: int = 0) -> None:
    """Refuse a token living longer than ``max_lifetime_seconds``: ``exp`` - ``iat``, or
    ``exp`` - now when it has no ``iat``; a token without ``exp`` lives forever.

    An ``iat`` more than ``leeway`` (the clock skew allowed for ``exp`` and ``nbf``)
    ahead of the broker's clock is refused: the issuer would not have signed it yet, and
    measured from a made-up future ``iat`` a token valid for months would pass. So a
    token accepted expires at most ``max_lifetime_seconds`` + ``leeway`` from now; an
    issuer whose clock runs ahead within the skew is measured from its own ``iat``."""
    exp = _number(claims, "exp")
    if exp is None:
        raise TokenInvalid(f"token has no 'exp' claim (maximum lifetime "
                           f"{max_lifetime_seconds} s)")
    now = time.time()
    issued = _number(claims, "iat")
    if issued is not None and issued > now + leeway:
        raise TokenInvalid(f"token 'iat' is {int(issued - now)} s in the future (clock skew "
                           f"allowed: {leeway} s)")
    lifetime = exp - (issued if issued is not None else now)
    if lifetime > max_lifetime_seconds:
        raise TokenInvalid(f"token lifetime {int(lifetime)} s exceeds the maximum of "
                           f"{max_lifetime_seconds} s")
