"""The session lifetime a broker reports after a SASL login (KIP-368 re-authentication)."""

from __future__ import annotations

INT64_MAX = 2**63 - 1
"""The largest lifetime SaslAuthenticate can carry (``session_lifetime_ms`` is an int64)."""


def session_lifetime_ms(now_ms: int, token_expiry_ms: int | None, max_reauth_ms: int) -> int:
    """The session lifetime to report after a successful authentication.

    0 means no limit and is returned only when neither bound applies (no token expiry,
    ``max_reauth_ms <= 0``). Otherwise it is the smaller of the time left until the token
    expires and ``max_reauth_ms`` (when positive). A token already at or past its expiry
    gives 1 ms, never 0 or less, so that it cannot be mistaken for "no limit"; none is
    longer than :data:`INT64_MAX`.
    """
    bounds: list[int] = []
    if token_expiry_ms is not None:
        bounds.append(token_expiry_ms - now_ms)
    if max_reauth_ms > 0:
        bounds.append(max_reauth_ms)
    if not bounds:
        return 0
    return min(max(min(bounds), 1), INT64_MAX)
