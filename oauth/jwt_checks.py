"""Verifying a JWT's signature and time claims with pyjwt, with the short, clear messages
both validators give clients."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import jwt

from oauth.errors import TokenInvalid


def decode_verified(token: str, key: Any, algorithms: Sequence[str], *, leeway: int,
                    require: Sequence[str] = ()) -> dict[str, Any]:
    """The token's claims once its signature, ``exp`` and ``nbf`` check out.

    Audience, issuer and subject are the callers' business (their rules differ).
    """
    try:
        claims: dict[str, Any] = jwt.decode(
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
    return claims
