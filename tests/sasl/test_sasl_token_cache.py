"""CachedTokenValidator in front of a real JwtTokenValidator: an accepted token is served
again without a check until its TTL or its ``exp``; a rejected one is checked every time;
the least recently used entry goes first."""

from __future__ import annotations

import base64
import time

import jwt
import pytest

from oauth import JwtTokenValidator, TokenInvalid, TokenSettings
from sasl.token_cache import CachedTokenValidator
from sasl.types import ValidatedToken

SECRET = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"


class Counting:
    """A real validator that counts its checks."""

    def __init__(self) -> None:
        self.inner = JwtTokenValidator(TokenSettings(
            secret_key="data:;base64," + base64.b64encode(SECRET).decode()))
        self.checks = 0

    def validate(self, token: str) -> ValidatedToken:
        self.checks += 1
        return self.inner.validate(token)


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def token(sub: str = "alice", exp_in: float = 3600) -> str:
    return jwt.encode({"sub": sub, "exp": int(time.time() + exp_in)}, SECRET, "HS256")


def test_an_accepted_token_is_checked_once_until_its_ttl() -> None:
    inner, clock = Counting(), Clock()
    cached = CachedTokenValidator(inner, ttl_seconds=60, clock=clock)
    good = token()
    assert cached.validate(good).principal == "alice"
    assert cached.validate(good).principal == "alice"
    assert inner.checks == 1
    clock.now += 61
    assert cached.validate(good).principal == "alice"
    assert inner.checks == 2


def test_a_cached_token_is_not_served_past_its_exp() -> None:
    inner, clock = Counting(), Clock()
    cached = CachedTokenValidator(inner, ttl_seconds=600, clock=clock)
    short = token(exp_in=30)
    cached.validate(short)
    cached.validate(short)
    assert inner.checks == 1
    clock.now += 40  # past its exp by the cache's clock: the inner validator decides
    cached.validate(short)
    assert inner.checks == 2


def test_a_rejected_token_is_checked_every_time() -> None:
    inner = Counting()
    cached = CachedTokenValidator(inner)
    forged = jwt.encode({"sub": "mallory", "exp": int(time.time() + 60)}, b"x" * 64, "HS256")
    for _ in range(2):
        with pytest.raises(TokenInvalid):
            cached.validate(forged)
    assert inner.checks == 2


def test_the_least_recently_used_token_goes_first() -> None:
    inner = Counting()
    cached = CachedTokenValidator(inner, max_entries=2)
    first, second, third = token("a"), token("b"), token("c")
    cached.validate(first)
    cached.validate(second)
    cached.validate(first)  # first is now the most recent
    cached.validate(third)  # drops second
    assert inner.checks == 3
    cached.validate(first)
    assert inner.checks == 3
    cached.validate(second)
    assert inner.checks == 4


def test_a_new_key_set_makes_cached_tokens_checked_again() -> None:
    inner = Counting()
    inner.keys_generation = 1  # type: ignore[attr-defined]
    cached = CachedTokenValidator(inner)
    good = token()
    cached.validate(good)
    cached.validate(good)
    assert inner.checks == 1
    inner.keys_generation = 2  # type: ignore[attr-defined]  # the issuer's keys changed
    cached.validate(good)
    assert inner.checks == 2


class FarExpiry:
    """A validator that accepts tokens whatever their ``exp`` (ours refuse one past the year
    9999): the cache must not fail on an expiry no float holds."""

    def __init__(self, expires_at_ms: int) -> None:
        self.expires_at_ms = expires_at_ms

    def validate(self, token: str) -> ValidatedToken:
        return ValidatedToken(principal=token, expires_at_ms=self.expires_at_ms, claims={})


@pytest.mark.parametrize("expiry_ms", [10**400, -(10**400)], ids=["huge", "huge negative"])
def test_an_expiry_no_float_holds(expiry_ms: int) -> None:
    cached = CachedTokenValidator(FarExpiry(expiry_ms), ttl_seconds=60)
    assert cached.validate("alice").expires_at_ms == expiry_ms
