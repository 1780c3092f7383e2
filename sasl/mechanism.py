"""What every token-checking SASL server mechanism shares: its validator, its outcome and
the tenant the client claimed."""

from __future__ import annotations

from sasl.printable import printable
from sasl.types import Authenticated, TokenValidator


class TokenMechanism:
    """Base of the server mechanisms: ``complete`` once ``result`` is set by a good login."""

    mechanism = ""

    def __init__(self, validator: TokenValidator) -> None:
        self._validator = validator
        self._result: Authenticated | None = None
        self._claimed_tenant: str | None = None
        self._refused: str | None = None

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

    def _claim_tenant(self, tenant: str) -> None:
        self._claimed_tenant = printable(tenant) if tenant else None
