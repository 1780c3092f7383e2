"""A JSON Web Key Set cache for token validation, shared by every login of a broker.

Keys are looked up by ``kid`` and algorithm. A login never waits for the issuer once keys
are held: the set is (re)fetched in a background thread, at most one fetch in flight,

- at start-up (:meth:`JwksCache.warm_up`) and, while no keys are held yet (the first
  fetch failed: the issuer is down), on a login at most once per ``retry_seconds``;
- when a token names an unknown ``kid`` (a key rotation, or a made-up ``kid``), at most
  once per ``refresh_min_seconds`` since the last attempt: that login is refused at once
  (the reason says the keys are being fetched; the client's retry passes once they are),
  so a flood of made-up ``kid`` values costs at most one fetch per interval and holds no
  login thread;
- when the keys are older than ``max_age_seconds`` (also at most once per
  ``refresh_min_seconds``; logins go on with the old keys meanwhile, and a failed refresh
  keeps them).

No lookup ever waits, not even for the first keys: while none were ever fetched and a
fetch is under way, a lookup raises :class:`~oauth.errors.KeysPending` carrying that
fetch's future and ``first_wait_seconds``, and the login (``edge.session``) waits for it
on its event loop, holding no thread and no permit of the login gate, then checks the
token again: a login arriving as the broker starts passes once the issuer answers, and
logins waiting on an issuer that does not answer stall nothing else.

Why a fetch failed (the issuer's URL, a resolver's or the issuer's error) is for the
operator: it is logged once per distinct failure, escaped and bounded, and a login is
told only that tokens cannot be checked now.
Thread-safe: logins run in worker threads.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

import jwt

from common.json_types import JsonValue
from oauth.errors import FetchError, KeysPending, KeysUnavailable, TokenInvalid
from oauth.keys import PublicKey
from sasl.printable import printable

log = logging.getLogger(__name__)

_FAMILY = {"RS": "RSA", "PS": "RSA", "ES": "EC"}
_CURVES = {"ES256": "P-256", "ES384": "P-384", "ES512": "P-521"}
MAX_KEYS = 100
"""Keys beyond this many in one set are ignored."""
UNKNOWN_KEY = "token signed with an unknown key"
"""The reason a token naming a ``kid`` the held set lacks is refused."""
FETCHING = "; fetching the issuer's keys now, retry shortly"
"""Added to it when a fetch is under way, which may bring that key (a rotation)."""
KEYS_UNAVAILABLE = ("cannot check tokens now: the issuer's signing keys are unavailable, "
                    "retry later")
"""What a login is told while no keys are held (why is in the broker's log)."""
ERROR_LOG_LIMIT = 512
"""How much of a fetch failure's text a log line quotes."""


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
                 max_age_seconds: float = 3600.0, first_wait_seconds: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._load = load
        self._refresh_min = refresh_min_seconds
        self._retry = retry_seconds
        self._max_age = max_age_seconds
        self._first_wait = first_wait_seconds
        self._clock = clock
        self._lock = threading.Lock()
        """Guards the fields below; never held while fetching."""
        self._keys: KeySet | None = None
        self._last_attempt: float | None = None
        self._logged_error: str | None = None
        """The failure logged last (each distinct one is logged once); None after a
        success. Written by the one fetch in flight only."""
        self._in_flight: Future[None] | None = None
        """Done when the fetch under way ends; None when none is."""
        self.fetches = 0
        """How many fetches were attempted (for tests and metrics)."""
        self.generation = 0
        """Counts the key sets taken: a token accepted under an earlier one is checked
        again (``sasl.token_cache``), so a withdrawn key stops admitting its tokens."""

    def key(self, kid: str | None, alg: str) -> PublicKey:
        """The verification key for a token header; raise TokenInvalid, KeysPending or
        KeysUnavailable. Never waits."""
        keys = self._keys if self._keys is not None else self._first_keys()
        found = self._lookup(keys, kid, alg)
        if found is not None:
            if self._stale(keys):
                self._refresh()
            return found
        fetching = self._refresh()
        reason = UNKNOWN_KEY if kid is not None \
            else "token has no key id and no single key fits it"
        raise TokenInvalid(reason + (FETCHING if fetching else ""))

    def warm_up(self) -> None:
        """Start fetching in the background unless keys are held or a fetch was tried
        recently (never raises, never waits)."""
        if self._keys is None:
            self._refresh()

    def wait_for_fetch(self, timeout: float) -> bool:
        """Wait until no fetch is under way (at most ``timeout`` seconds); True if none is.
        (For tools and tests: a login never waits in a thread.)"""
        with self._lock:
            in_flight = self._in_flight
        if in_flight is None:
            return True
        with contextlib.suppress(TimeoutError):
            in_flight.result(timeout)
        return in_flight.done()

    def _first_keys(self) -> KeySet:
        """No keys were ever taken: start a fetch if one is due; KeysPending while one is
        under way, else KeysUnavailable."""
        with self._lock:
            keys = self._keys
            if keys is not None:
                return keys  # taken since the caller looked
            in_flight = self._in_flight
            if in_flight is None and self._due():
                in_flight = self._start_locked()
        if in_flight is not None:
            raise KeysPending(KEYS_UNAVAILABLE, in_flight, self._first_wait)
        raise KeysUnavailable(KEYS_UNAVAILABLE)

    def _stale(self, keys: KeySet) -> bool:
        return self._clock() - keys.fetched_at >= self._max_age

    def _refresh(self) -> bool:
        """Start a background fetch unless one is under way or the last was too recent;
        True when a fetch is under way now."""
        with self._lock:
            if self._in_flight is None:
                if not self._due():
                    return False
                self._start_locked()
            return True

    def _due(self) -> bool:
        if self._last_attempt is None:
            return True
        wait = self._retry if self._keys is None else self._refresh_min
        return self._clock() - self._last_attempt >= wait

    def _start_locked(self) -> Future[None]:
        started = self._clock()
        self._last_attempt = started
        self.fetches += 1
        done: Future[None] = Future()
        done.set_running_or_notify_cancel()  # running: a waiter giving up cannot cancel it
        self._in_flight = done
        threading.Thread(target=self._fetch, args=(started, done), name="oauth-jwks-fetch",
                         daemon=True).start()
        return done

    def _fetch(self, started: float, done: Future[None]) -> None:
        fresh: KeySet | None = None
        error = "the fetch failed"  # until it ends otherwise (a loader bug: its traceback)
        try:
            fresh = parse_key_set(self._load(), started)
            error = ""
        except FetchError as exc:
            error = str(exc)
        finally:
            held = self._settle(fresh, done)
        if fresh is None:
            self._log_failure(printable(error, ERROR_LOG_LIMIT), held)
            return
        if held is None or held.kids != fresh.kids or self._logged_error is not None:
            log.info("OAuth signing keys fetched: kid %s", ", ".join(fresh.kids) or "(none)")
        self._logged_error = None

    def _log_failure(self, error: str, held: KeySet | None) -> None:
        if error == self._logged_error:
            return  # said already; the next success says it is over
        self._logged_error = error
        log.warning("cannot fetch the OAuth issuer's signing keys: %s%s (logged once until "
                    "it changes or a fetch succeeds)", error,
                    "; keeping the keys fetched before" if held is not None else
                    "; logins fail until a fetch succeeds")

    def _settle(self, fresh: KeySet | None, done: Future[None]) -> KeySet | None:
        """Take a fetch's outcome and end it; return the keys held before."""
        with self._lock:
            held = self._keys
            if fresh is not None:
                self._keys = fresh
                self.generation += 1
            self._in_flight = None
        done.set_result(None)
        return held

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
