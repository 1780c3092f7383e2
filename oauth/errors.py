"""Exceptions raised by the token validators."""

from __future__ import annotations

from sasl.types import TokenRejected


class TokenInvalid(TokenRejected):
    """A token failed validation; ``message`` is short and safe to show the client."""
