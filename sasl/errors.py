"""Exceptions raised by the SASL server mechanisms and the mechanism registry."""

from __future__ import annotations

from collections.abc import Sequence


class SaslFailure(Exception):
    """Authentication failed; ``message`` is safe to send back to the client."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UnsupportedMechanism(Exception):
    """The client asked for a SASL mechanism that is not enabled on this listener.

    ``allowed`` lists the enabled mechanisms, as a Kafka SaslHandshake response reports them.
    """

    def __init__(self, allowed: Sequence[str], mechanism: str | None = None) -> None:
        self.allowed: tuple[str, ...] = tuple(allowed)
        self.mechanism = mechanism
        enabled = ", ".join(self.allowed) if self.allowed else "none"
        subject = f"SASL mechanism {mechanism!r}" if mechanism is not None else "SASL mechanism"
        self.message = f"unsupported {subject}; enabled mechanisms: {enabled}"
        super().__init__(self.message)
