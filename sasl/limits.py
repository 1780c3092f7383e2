"""Size limits applied to SASL client messages before parsing them."""

from __future__ import annotations

from sasl.errors import SaslFailure

MAX_CLIENT_MESSAGE_BYTES = 64 * 1024
"""The largest client message a mechanism accepts (the broker also caps frames)."""


def check_message_size(message: bytes) -> None:
    """Raise SaslFailure if ``message`` is larger than :data:`MAX_CLIENT_MESSAGE_BYTES`."""
    if len(message) > MAX_CLIENT_MESSAGE_BYTES:
        raise SaslFailure(
            f"SASL message too large: {len(message)} bytes (limit {MAX_CLIENT_MESSAGE_BYTES})"
        )
