"""KIP-368 session lifetime reported after a SASL login."""

from __future__ import annotations

import pytest

from sasl import session_lifetime_ms
from sasl.lifetime import INT64_MAX


@pytest.mark.parametrize(
    ("now", "expiry", "max_reauth", "expected"),
    [
        (1_000, None, 0, 0),
        (1_000, None, -5, 0),
        (1_000, None, 60_000, 60_000),
        (1_000, 31_000, 0, 30_000),
        (1_000, 31_000, 60_000, 30_000),
        (1_000, 301_000, 60_000, 60_000),
        (1_000, 1_000, 60_000, 1),
        (1_000, 500, 0, 1),
        (1_000, 500, 60_000, 1),
        (1_000, 10**20, 0, INT64_MAX),  # what SaslAuthenticate's int64 can carry
        (1_000, 2**80, 2**70, INT64_MAX),
    ],
)
def test_session_lifetime(now: int, expiry: int | None, max_reauth: int, expected: int) -> None:
    assert session_lifetime_ms(now, expiry, max_reauth) == expected
