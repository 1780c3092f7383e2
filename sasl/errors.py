"""What the SASL server mechanisms raise, and how much client text they quote."""

from __future__ import annotations

from concurrent.futures import Future

from sasl.printable import printable


class SaslFailure(Exception):
    """Authentication failed; ``message`` is safe to send back to the client, to log and
    to audit: whatever client text it quotes, it is escaped and bounded (see
    :func:`sasl.printable.printable`)."""

    def __init__(self, message: str) -> None:
        self.message = printable(message)
        super().__init__(self.message)


class SaslPending(SaslFailure):
    """The step cannot be judged until ``ready`` is done (see ``TokenPending``): it did not
    happen; the caller waits (at most ``wait_seconds``, holding no thread) and gives the
    same message again. ``message`` is the failure if it does not."""

    def __init__(self, message: str, ready: Future[None], wait_seconds: float) -> None:
        super().__init__(message)
        self.ready = ready
        self.wait_seconds = wait_seconds


MECHANISM_LIMIT = 64
"""How much of a client's mechanism name is quoted (real names are at most 20 characters)."""
