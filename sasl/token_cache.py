"""A cache of accepted tokens in front of a validator, so a client that logs in again with
the token it holds (reconnects, a fleet restarting) costs no second signature check.

Only accepted tokens are kept, by their exact text, for at most ``ttl_seconds`` and never
past their ``exp``; at most ``max_entries`` (least recently used dropped first). A
validator whose keys change (JWKS) says so with a ``keys_generation`` attribute: a token
accepted under other keys is checked again, so a key the issuer withdrew stops admitting
its tokens as soon as the broker has the new key set. A rejected token is checked in full
every time.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from sasl.types import TokenValidator, ValidatedToken

DEFAULT_TTL_SECONDS = 60.0
DEFAULT_MAX_ENTRIES = 10_000


class CachedTokenValidator:
    """A :class:`TokenValidator` that remembers the tokens ``inner`` accepted."""

    def __init__(self, inner: TokenValidator, *, ttl_seconds: float = DEFAULT_TTL_SECONDS,
                 max_entries: int = DEFAULT_MAX_ENTRIES,
                 clock: Callable[[], float] = time.time) -> None:
        self.inner = inner
        self._ttl = ttl_seconds
        self._max = max_entries
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, object, ValidatedToken]] = OrderedDict()
        self._lock = threading.Lock()  # logins are checked in worker threads

    def _generation(self) -> object:
        return getattr(self.inner, "keys_generation", None)

    def validate(self, token: str) -> ValidatedToken:
        now = self._clock()
        with self._lock:
            held = self._entries.get(token)
            if held is not None:
                until, generation, validated = held
                if now < until and generation == self._generation():
                    self._entries.move_to_end(token)
                    return validated
                self._entries.pop(token, None)
        generation = self._generation()
        validated = self.inner.validate(token)
        until = now + self._ttl
        expiry_ms = validated.expires_at_ms
        if expiry_ms is not None and expiry_ms < until * 1000:  # compared as numbers
            until = max(expiry_ms, 0) / 1000  # (a huge int has no float)
        if until > now:
            with self._lock:
                self._entries[token] = (until, generation, validated)
                while len(self._entries) > self._max:
                    self._entries.popitem(last=False)
        return validated
