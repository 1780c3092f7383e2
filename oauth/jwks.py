"""A JSON Web Key Set cache for token validation, shared by every login of a broker.

Keys are looked up by ``kid`` and algorithm. The set is (re)fetched:

- on first use, and on the next use after a failed fetch once ``retry_seconds`` passed;
- when a token names an unknown ``kid``, at most once per ``refresh_min_seconds``, so a
  flood of made-up ``kid`` values costs at most one fetch per interval;
- when it is older than ``max_age_seconds`` (a failed refresh keeps the old keys).

Fetches are single-flight: concurrent validations that need one wait for the same fetch
instead of starting their own. Lookups of known keys never wait for a fetch.
Thread-safe; fetches run in the caller's (worker) thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import jwt

from common.json_types import JsonValue
from oauth.errors import FetchError, KeysUnavailable, TokenInvalid
from oauth.keys import PublicKey

log = logging.getLogger(__name__)

_FAMILY = {"RS": "RSA", "PS": "RSA", "ES": "EC"}
_CURVES = {"ES256": "P-256", "ES384": "P-384", "ES512": "P-521"}
MAX_KEYS = 100
"""Keys beyond this many in one set are ignored."""


@dataclass(frozen=True)
class KeySet:
    """The usable signing keys of one fetched JWKS, as JSON objects."""

    keys: tuple[Mapping[str, JsonValue], ...]
    fetched_at: float
    verifiers: dict[tuple[str | None, str], PublicKey] = field(default_factory=dict, compare=False)
    """Key objects built from ``keys``, by (kid, alg)."""

    @property
    def kids(self) -> tuple[str, ...]:
        """The key ids, in document order."""
        return tuple(str(k["kid"]) for k in self.keys if isinstance(k.get("kid"), str))


def parse_key_set(document: Mapping[str, JsonValue], fetched_at: float) -> KeySet:
    """Keep the entries of a JWKS document that can verify signatures; raise FetchError."""
    entries = document.get("keys")
    if not isinstance(entries, list):
        raise FetchError("JWKS document has no 'keys' list")
    usable = [
        entry for entry in entries
        if isinstance(entry, dict) and entry.get("kty") in ("RSA", "EC")
        and entry.get("use", "sig") == "sig"
        and ("kid" not in entry or isinstance(entry["kid"], str))
    ]
    return KeySet(tuple(usable[:MAX_KEYS]), fetched_at)


def _fits(entry: Mapping[str, JsonValue], alg: str) -> bool:
    if entry.get("alg") not in (None, alg):
        return False
    if entry.get("kty") != _FAMILY.get(alg[:2]):
        return False
    return alg not in _CURVES or entry.get("crv") == _CURVES[alg]


class JwksCache:
    """Signing keys from ``load`` (which returns a JWKS document or raises FetchError)."""

    def __init__(self, load: Callable[[], Mapping[str, JsonValue]], *,
                 refresh_min_seconds: float = 10.0, retry_seconds: float = 1.0,
                 max_age_seconds: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._load = load
        self._refresh_min = refresh_min_seconds
        self._retry = retry_seconds
        self._max_age = max_age_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: KeySet | None = None
        self._last_attempt: float | None = None
        self._last_error: str | None = None
        self.fetches = 0
        """How many fetches were attempted (for tests and metrics)."""
        self.generation = 0
        """Counts the key sets taken: a token accepted under an earlier one is checked
        again (``sasl.token_cache``), so a withdrawn key stops admitting its tokens."""

    def key(self, kid: str | None, alg: str) -> PublicKey:
        """The verification key for a token header; raise TokenInvalid or KeysUnavailable."""
        keys = self._keys
        found = self._lookup(keys, kid, alg) if keys is not None else None
        if found is not None:
            assert keys is not None
            if not self._stale(keys):
                return found
            if not self._lock.acquire(blocking=False):
                return found  # stale, but another login is refreshing: use what we have
        else:
            self._lock.acquire()
        try:
            return self._key_locked(kid, alg)
        finally:
            self._lock.release()

    def _key_locked(self, kid: str | None, alg: str) -> PublicKey:
        keys = self._keys
        if keys is None or self._stale(keys) or self._lookup(keys, kid, alg) is None:
            self._maybe_fetch(keys)
        keys = self._keys
        if keys is None:
            raise KeysUnavailable(
                "cannot check tokens now: the issuer's signing keys are unavailable "
                f"({self._last_error or 'not fetched yet'})")
        found = self._lookup(keys, kid, alg)
        if found is None:
            raise TokenInvalid("token signed with an unknown key" if kid is not None
                               else "token has no key id and no single key fits it")
        return found

    def warm_up(self) -> None:
        """Fetch now unless keys are held or a fetch was tried recently (never raises)."""
        with self._lock:
            if self._keys is None:
                self._maybe_fetch(None)

    def _stale(self, keys: KeySet) -> bool:
        return self._clock() - keys.fetched_at >= self._max_age

    def _maybe_fetch(self, held: KeySet | None) -> None:
        now = self._clock()
        if self._last_attempt is not None:
            wait = self._retry if self._last_error is not None else self._refresh_min
            if now - self._last_attempt < wait:
                return
        self._last_attempt = now
        self.fetches += 1
        try:
            fresh = parse_key_set(self._load(), now)
        except FetchError as exc:
            self._last_error = str(exc)
            log.warning("cannot fetch the OAuth issuer's signing keys: %s%s", exc,
                        "; keeping the keys fetched before" if held is not None else "")
            return
        self._last_error = None
        if held is None or held.kids != fresh.kids:
            log.info("OAuth signing keys fetched: kid %s", ", ".join(fresh.kids) or "(none)")
        self._keys = fresh
        self.generation += 1

    def _lookup(self, keys: KeySet, kid: str | None, alg: str) -> PublicKey | None:
        cached = keys.verifiers.get((kid, alg))
        if cached is not None:
            return cached
        if kid is not None:
            candidates = [k for k in keys.keys if k.get("kid") == kid and _fits(k, alg)]
        else:
            candidates = [k for k in keys.keys if _fits(k, alg)]
        if len(candidates) != 1:
            return None
        try:
            verifier: object = jwt.PyJWK(dict(candidates[0]), algorithm=alg).key
        except (jwt.PyJWTError, ValueError, TypeError, KeyError):
            return None
        if not isinstance(verifier, PublicKey):
            return None  # a private JWK in a key set: it cannot verify, so it does not fit
        keys.verifiers[(kid, alg)] = verifier
        return verifier
