"""The JWKS cache: lookups by kid and algorithm, rate-limited background refetches on
unknown kids (the login refused at once, never waiting), the first keys pending (never
waited for here), retry after failures, stale keys kept while the issuer is down."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from joserfc.jwk import ECKey, RSAKey

from oauth.errors import FetchError, KeysPending, KeysUnavailable, TokenInvalid
from oauth.jwks import JwksCache, parse_key_set


def rsa(kid: str, **params: str) -> dict[str, Any]:
    key = RSAKey.generate_key(2048, parameters={"kid": kid, **params})
    return dict(key.as_dict(private=False))


RSA_A = rsa("a", alg="RS256", use="sig")
RSA_B = rsa("b")
EC_P256 = dict(ECKey.generate_key("P-256", parameters={"kid": "e"}).as_dict(private=False))


class Issuer:
    """A JWKS source whose document and availability the test controls."""

    def __init__(self, *keys: Mapping[str, Any]) -> None:
        self.keys = list(keys)
        self.calls = 0
        self.down = False
        self.delay = 0.0
        self.gate: threading.Event | None = None
        """When given, a fetch answers only once it is set (the issuer hangs until then)."""

    def __call__(self) -> Mapping[str, Any]:
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        if self.gate is not None:
            self.gate.wait(30)
        if self.down:
            raise FetchError("cannot reach http://issuer/jwks: connection refused")
        return {"keys": list(self.keys)}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fetched(keys: JwksCache) -> JwksCache:
    """``keys`` once its first fetch is over (a lookup never waits for it)."""
    keys.warm_up()
    assert keys.wait_for_fetch(10)
    return keys


def cache(source: Issuer, clock: Clock, **kwargs: float) -> JwksCache:
    """A cache on a test clock, its first fetch over."""
    options = {"refresh_min_seconds": 10.0, "retry_seconds": 1.0, "max_age_seconds": 3600.0,
               **kwargs}
    return fetched(JwksCache(source, clock=clock, **options))


def test_known_kid_is_served_from_the_cache() -> None:
    source, clock = Issuer(RSA_A, RSA_B), Clock()
    keys = cache(source, clock)
    first = keys.key("a", "RS256")
    assert keys.key("a", "RS256") is first
    assert keys.key("b", "PS512") is not None
    assert source.calls == 1 and keys.fetches == 1


def test_unknown_kid_refetch_is_rate_limited() -> None:
    source, clock = Issuer(RSA_A), Clock()
    keys = cache(source, clock)
    keys.key("a", "RS256")
    source.keys.append(RSA_B)
    clock.now += 3
    with pytest.raises(TokenInvalid, match=r"unknown key$"):
        keys.key("b", "RS256")
    assert source.calls == 1
    for _ in range(100):
        with pytest.raises(TokenInvalid, match=r"unknown key$"):
            keys.key("zzz", "RS256")
    assert source.calls == 1
    clock.now += 7
    with pytest.raises(TokenInvalid, match="unknown key; fetching the issuer's keys now"):
        keys.key("b", "RS256")
    assert keys.wait_for_fetch(10)
    assert keys.key("b", "RS256") is not None  # the client's retry
    assert source.calls == 2
    with pytest.raises(TokenInvalid, match=r"unknown key$"):
        keys.key("zzz", "RS256")
    assert source.calls == 2


def test_unknown_kids_are_refused_at_once_while_one_fetch_runs() -> None:
    source = Issuer(RSA_A)
    keys = fetched(JwksCache(source, refresh_min_seconds=0.0))
    keys.key("a", "RS256")
    source.keys.append(RSA_B)
    source.gate = threading.Event()  # the issuer hangs
    barrier = threading.Barrier(16)

    def look(_: int) -> str:
        barrier.wait()
        try:
            keys.key("b", "RS256")
        except TokenInvalid as refused:
            return refused.message
        return "accepted"

    with ThreadPoolExecutor(16) as pool:
        reasons = set(pool.map(look, range(16)))
    # Every lookup was answered while the issuer still held the one fetch.
    assert reasons == {"token signed with an unknown key; fetching the issuer's keys now, "
                       "retry shortly"}
    assert source.calls == 2
    assert keys.key("a", "RS256") is not None  # known keys never wait
    source.gate.set()
    assert keys.wait_for_fetch(10)
    assert keys.key("b", "RS256") is not None
    assert source.calls == 2


def test_before_the_first_keys_a_lookup_is_pending_on_the_fetch() -> None:
    """No lookup waits for the first fetch: each is told which fetch to wait for, and for
    how long (a login waits on its event loop, then looks again)."""
    source = Issuer(RSA_A)
    source.gate = threading.Event()  # the issuer hangs
    keys = JwksCache(source, first_wait_seconds=0.2)
    keys.warm_up()
    with ThreadPoolExecutor(16) as pool:
        pending = list(pool.map(lambda _: pending_on(keys), range(16)))
    assert len({id(p.ready) for p in pending}) == 1  # the one fetch, for all
    ready = pending[0].ready
    assert not ready.done() and ready.cancel() is False  # a waiter cannot cancel it
    assert {p.wait_seconds for p in pending} == {0.2}
    assert "signing keys are unavailable" in pending[0].message
    source.gate.set()
    ready.result(10)
    assert keys.key("a", "RS256") is not None
    assert source.calls == 1


def pending_on(keys: JwksCache) -> KeysPending:
    with pytest.raises(KeysPending) as pending:
        keys.key("a", "RS256")
    return pending.value


def test_issuer_down_then_back() -> None:
    source, clock = Issuer(RSA_A), Clock()
    source.down = True
    keys = cache(source, clock, retry_seconds=1.0)  # the first fetch failed
    keys.warm_up()
    with pytest.raises(KeysUnavailable, match="signing keys are unavailable") as refused:
        keys.key("a", "RS256")
    assert not isinstance(refused.value, KeysPending)  # no fetch to wait for
    assert "connection refused" not in refused.value.message  # the log says why
    assert source.calls == 1  # within the retry interval: no new request
    source.down = False
    clock.now += 1
    pending_on(keys).ready.result(10)  # a login starts the next fetch
    assert keys.key("a", "RS256") is not None
    assert source.calls == 2


def test_stale_keys_are_refreshed_and_kept_when_the_issuer_is_down() -> None:
    source, clock = Issuer(RSA_A), Clock()
    keys = cache(source, clock, max_age_seconds=60)
    keys.key("a", "RS256")
    clock.now += 61
    source.down = True
    assert keys.key("a", "RS256") is not None
    assert keys.wait_for_fetch(10)
    assert source.calls == 2
    assert keys.key("a", "RS256") is not None
    source.down = False
    source.keys = [RSA_B]
    clock.now += 2
    assert keys.key("a", "RS256") is not None  # within refresh_min of the failed refresh
    assert source.calls == 2
    clock.now += 8
    assert keys.key("a", "RS256") is not None  # still stale: refreshed in the background
    assert keys.wait_for_fetch(10)
    with pytest.raises(TokenInvalid, match="unknown key"):
        keys.key("a", "RS256")
    assert source.calls == 3


def test_algorithm_and_curve_must_fit_the_key() -> None:
    source, clock = Issuer(RSA_A, RSA_B, EC_P256), Clock()
    keys = cache(source, clock)
    for kid, alg in [("a", "PS256"), ("a", "ES256"), ("b", "ES256"), ("e", "ES384"),
                     ("e", "RS256")]:
        with pytest.raises(TokenInvalid):
            keys.key(kid, alg)
    assert keys.key("e", "ES256") is not None


def test_token_without_kid_needs_a_single_fitting_key() -> None:
    source, clock = Issuer(RSA_A, EC_P256), Clock()
    keys = cache(source, clock)
    assert keys.key(None, "ES256") is not None
    source.keys.append(RSA_B)
    clock.now += 20
    with pytest.raises(TokenInvalid, match=r"no key id.*fetching"):
        keys.key(None, "RS384")
    assert keys.wait_for_fetch(10)
    assert keys.key(None, "RS384") is not None  # only b fits RS384 ('a' is RS256 only)
    with pytest.raises(TokenInvalid, match="no key id"):
        keys.key(None, "RS256")


def test_key_set_parsing_skips_unusable_keys() -> None:
    document = {"keys": [RSA_A, {**RSA_B, "use": "enc"}, {"kty": "oct", "k": "c2VjcmV0"},
                         "junk", {**EC_P256, "kid": 5}]}
    assert parse_key_set(document, 0.0).kids == ("a",)
    with pytest.raises(FetchError):
        parse_key_set({"keys": "none"}, 0.0)
    source, clock = Issuer(), Clock()
    source.keys = []
    keys = cache(source, clock)
    with pytest.raises(TokenInvalid, match="unknown key"):
        keys.key("a", "RS256")


def test_known_kid_does_not_wait_for_a_refresh_in_progress() -> None:
    source, clock = Issuer(RSA_A), Clock()
    keys = cache(source, clock, max_age_seconds=60)
    keys.key("a", "RS256")
    clock.now += 61
    source.gate = threading.Event()  # the refresh hangs until the end of the test
    assert keys.key("a", "RS256") is not None
    assert keys.key("a", "RS256") is not None
    assert not keys.wait_for_fetch(0)
    source.gate.set()
    assert keys.wait_for_fetch(10)
    assert source.calls == 2
