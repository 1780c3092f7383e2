"""What every token-checking SASL server mechanism shares: its validator, its outcome and
the tenant the client claimed."""

from __future__ import annotations

from sasl.errors import SaslFailure, SaslPending
from sasl.printable import printable
from sasl.types import (
    Authenticated,
    TokenPending,
    TokenRejected,
    TokenValidator,
    ValidatedToken,
)


class TokenMechanism:
    """Base of the server mechanisms: ``complete`` once ``result`` is set by a good login."""

    mechanism = ""

    def __init__(self, validator: TokenValidator) -> None:
        self._validator = validator
        self._result: Authenticated | None = None
        self._claimed_tenant: str | None = None
        self._refused: str | None = None
        self._waited = False

    @property
    def complete(self) -> bool:
        """Whether the exchange ended with a login."""
        return self._result is not None

    @property
    def result(self) -> Authenticated | None:
        """The login, once complete."""
        return self._result

    @property
    def refused(self) -> str | None:
        """Why the login failed, once a step answered the failure with an error challenge
        (RFC 7628) instead of raising (see SaslServer)."""
        return self._refused

    @property
    def claimed_tenant(self) -> str | None:
        """The tenant the client named so far, escaped and bounded (see SaslServer)."""
        return self._claimed_tenant

    def _validate(self, token: str) -> ValidatedToken:
        """The validator's verdict on ``token`` (SaslFailure: refused). One it cannot give
        yet (TokenPending) is SaslPending the first time in an exchange, the step undone
        by the mechanism, so that the caller waits and steps again; a refusal after that."""
        try:
            return self._validator.validate(token)
        except TokenPending as pending:
            if self._waited:
                raise SaslFailure(pending.message) from None
            self._waited = True
            raise SaslPending(pending.message, pending.ready, pending.wait_seconds) from None
        except TokenRejected as exc:
            raise SaslFailure(exc.message) from None

    def _claim_tenant(self, tenant: str) -> None:
        self._claimed_tenant = printable(tenant) if tenant else None
