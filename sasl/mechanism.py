"""What every token-checking SASL server mechanism shares: its validator and its outcome."""

from __future__ import annotations

from sasl.types import Authenticated, TokenValidator


class TokenMechanism:
    """Base of the server mechanisms: ``complete`` once ``result`` is set by a good login."""

    mechanism = ""

    def __init__(self, validator: TokenValidator) -> None:
        self._validator = validator
        self._result: Authenticated | None = None

    @property
    def complete(self) -> bool:
        """Whether the exchange ended with a login."""
        return self._result is not None

    @property
    def result(self) -> Authenticated | None:
        """The login, once complete."""
        return self._result
