"""KIP-368 session lifetime reported after a SASL login."""

from __future__ import annotations

import pytest

from sasl import session_lifetime_ms


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
    ],
)
def test_session_lifetime(now: int, expiry: int | None, max_reauth: int, expected: int) -> None:
    assert session_lifetime_ms(now, expiry, max_reauth) == expected
