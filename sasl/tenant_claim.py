"""The tenant a token binds its login to: the ``oauth.tenant.claim`` claim, when the
operator configured one and the token carries it.

The tenant the client names (the PLAIN username, the OAUTHBEARER ``tenant`` extension)
must then be that one: a token issued for one tenant never logs in to another, whatever
the mechanism. A token without the claim binds nothing: the tenant the client names
applies (else the broker's default), as the README states.
"""

from __future__ import annotations

from common.names import TENANT_NAME_RULE, is_valid_tenant_name
from sasl.errors import SaslFailure
from sasl.types import ValidatedToken


def token_tenant(token: ValidatedToken, claim: str | None) -> str | None:
    """The tenant the token's ``claim`` names; None without a claim configured or in the
    token. SaslFailure when the claim is not a valid tenant name."""
    if claim is None:
        return None
    value = token.claims.get(claim)
    if value is None:
        return None
    if not isinstance(value, str) or not is_valid_tenant_name(value):
        raise SaslFailure(f"invalid tenant in token claim {claim!r}: expected {TENANT_NAME_RULE}")
    return value


def bound_tenant(bound: str | None, named: str | None, where: str) -> str | None:
    """The login's tenant: ``bound`` (the token's, from :func:`token_tenant`), which
    ``named`` (the tenant the client named in ``where``, if any) must equal; else
    ``named``. SaslFailure when they differ."""
    if bound is None:
        return named
    if named is not None and named != bound:
        raise SaslFailure(f"the tenant in {where} is not the one the token was issued for: "
                          "a token logs in to its own tenant only")
    return bound
