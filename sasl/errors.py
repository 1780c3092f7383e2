"""Exceptions raised by the SASL server mechanisms and the mechanism registry."""

from __future__ import annotations

from collections.abc import Sequence

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


class UnsupportedMechanism(Exception):
    """The client asked for a SASL mechanism that is not enabled on this listener.

    ``allowed`` lists the enabled mechanisms, as a Kafka SaslHandshake response reports them.
    """

    def __init__(self, allowed: Sequence[str], mechanism: str | None = None) -> None:
        self.allowed: tuple[str, ...] = tuple(allowed)
        self.mechanism = mechanism
        enabled = ", ".join(self.allowed) if self.allowed else "none"
        subject = ("SASL mechanism" if mechanism is None
                   else f"SASL mechanism '{printable(mechanism, MECHANISM_LIMIT)}'")
        self.message = f"unsupported {subject}; enabled mechanisms: {enabled}"
        super().__init__(self.message)
