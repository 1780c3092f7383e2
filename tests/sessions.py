"""KIP-368 session lifetimes as a client can bound them, to wait for a session's end (or
a point inside it) instead of sleeping for a guessed while.

The broker starts a session's clock when it handles the login, which is after the client
sent it and before the client read the answer; it ends the session ``lifetime_ms`` later
by the wall clock (``time.time``, whole milliseconds) and refuses a request that arrives
strictly after that. So a session answered at ``answered_at`` has surely ended once
``answered_at + lifetime`` (+ 2 ms for the rounding) has passed, and is surely alive for a
request sent before ``sent_at + lifetime`` arrives: bounds by the broker's own rule, with
no margin for a slow machine needed on the waiting side.
"""

from __future__ import annotations

import time


def wait_until(at: float) -> None:
    """Return once ``time.time()`` is past ``at`` (at once when it already is)."""
    while (left := at - time.time()) > 0:
        time.sleep(left)


def wait_past_session(answered_at: float, lifetime_ms: int) -> None:
    """Return once a session whose login was answered (``time.time()``) at ``answered_at``
    with ``lifetime_ms`` has ended on the broker."""
    assert lifetime_ms > 0, "a session without a lifetime never ends"
    wait_until(answered_at + (lifetime_ms + 2) / 1000)
