"""The SASL OAUTHBEARER server mechanism (RFC 7628) with KIP-368-style expiry.

A good client initial response is answered with empty bytes. Any failure of the first
message (too large, not UTF-8, malformed GS2 header or key/value pairs, a rejected token,
an authorization id other than the principal, a bad tenant, a ``tenant`` extension other
than the token's tenant claim: ``sasl.tenant_claim``) is answered with the RFC 7628
error ``{"status":"invalid_token"}`` (the login has failed: :attr:`refused` says why);
the client then sends a lone ``\\x01`` and the second step fails with that reason.
"""

from __future__ import annotations

import json
from types import MappingProxyType

from common.names import TENANT_NAME_RULE, is_valid_tenant_name
from sasl.errors import SaslFailure, SaslPending
from sasl.limits import check_message_size
from sasl.mechanism import TokenMechanism
from sasl.oauthbearer_message import (
    ClientInitialResponse,
    MalformedHeader,
    MalformedMessage,
    parse_client_initial_response,
)
from sasl.tenant_claim import bound_tenant, token_tenant
from sasl.types import Authenticated, TokenValidator, ValidatedToken

TENANT_EXTENSION = "tenant"
ERROR_CHALLENGE = json.dumps({"status": "invalid_token"}, separators=(",", ":")).encode()


class OAuthBearerServer(TokenMechanism):
    """One OAUTHBEARER exchange: one client message, plus the dummy reply after an error."""

    mechanism = "OAUTHBEARER"

    def __init__(self, validator: TokenValidator, *, tenant_claim: str | None = None) -> None:
        super().__init__(validator)
        self._tenant_claim = tenant_claim
        self._steps = 0

    def step(self, message: bytes) -> bytes:
        self._steps += 1
        if self._steps == 1:
            try:
                return self._first_step(message)
            except SaslPending:
                self._steps = 0  # not a step: the same message comes again
                raise
        if self._steps == 2 and self._refused is not None:
            raise SaslFailure(self._refused)
        raise SaslFailure("OAUTHBEARER exchange is already over")

    def _first_step(self, message: bytes) -> bytes:
        try:
            self._result = self._authenticate(message)
        except SaslPending:
            raise
        except SaslFailure as failure:
            return self._error_challenge(failure.message)
        return b""

    def _authenticate(self, message: bytes) -> Authenticated:
        check_message_size(message)
        try:
            text = message.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslFailure("invalid OAUTHBEARER message: not valid UTF-8") from None
        try:
            response = parse_client_initial_response(text)
        except (MalformedHeader, MalformedMessage) as exc:
            raise SaslFailure(str(exc)) from None
        if TENANT_EXTENSION in response.extensions:
            self._claim_tenant(response.extensions[TENANT_EXTENSION])
        token = self._validate(response.token)
        if response.authzid is not None and response.authzid != token.principal:
            raise SaslFailure("authorization id does not match the token's principal")
        return Authenticated(
            principal=token.principal,
            tenant=self._tenant(response, token),
            namespace=None,
            expires_at_ms=token.expires_at_ms,
            mechanism=self.mechanism,
            extensions=MappingProxyType(dict(response.extensions)),
        )

    def _tenant(self, response: ClientInitialResponse, token: ValidatedToken) -> str | None:
        bound = token_tenant(token, self._tenant_claim)
        if bound is not None:
            self._claim_tenant(bound)
        named = response.extensions.get(TENANT_EXTENSION)
        if named is not None and not is_valid_tenant_name(named):
            raise SaslFailure(f"invalid tenant in extension {TENANT_EXTENSION!r}: expected "
                              f"{TENANT_NAME_RULE}")
        return bound_tenant(bound, named, f"extension {TENANT_EXTENSION!r}")

    def _error_challenge(self, reason: str) -> bytes:
        self._refused = reason
        return ERROR_CHALLENGE
