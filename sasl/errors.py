"""What the SASL server mechanisms raise, and how much client text they quote."""

from __future__ import annotations

from sasl.printable import printable


class SaslFailure(Exception):
    """Authentication failed; ``message`` is safe to send back to the client, to log and
    to audit: whatever client text it quotes, it is escaped and bounded (see
    :func:`sasl.printable.printable`)."""

    def __init__(self, message: str) -> None:
        self.message = printable(message)
        super().__init__(self.message)


MECHANISM_LIMIT = 64
"""How much of a client's mechanism name is quoted (real names are at most 20 characters)."""
