"""ConnectionSasl: a connection's SASL rules and progress, driven without a socket (the clock
by hand), with the real PLAIN mechanism and a real token validator."""

from __future__ import annotations

import base64
import time

import jwt
import pytest

from oauth import JwtTokenValidator, TokenSettings
from sasl import Authenticated, PlainServer, SaslFailure
from sasl.connection_state import ConnectionSasl, Handshake, Phase

SECRET = b"state-test-secret-state-test-secret-state-test-secret!!"
NOW = 0
"""The clock of the inputs: now, set before each test (tokens are checked against the real
clock; a module's tests may run many minutes after it was imported), whole seconds."""
OFFERED = ("PLAIN", "OAUTHBEARER")


@pytest.fixture(autouse=True)
def _clock() -> None:
    global NOW  # the tests read it as a constant of their own run
    NOW = int(time.time()) * 1000


@pytest.fixture
def validator() -> JwtTokenValidator:
    url = f"data:;base64,{base64.b64encode(SECRET).decode()}"
    return JwtTokenValidator(TokenSettings(secret_key=url))


def plain(validator: JwtTokenValidator, tenant: str, role: str = "alice",
          exp_ms: int | None = None) -> Authenticated:
    """A real PLAIN exchange for ``tenant``; its result."""
    claims: dict[str, object] = {"sub": role}
    if exp_ms is not None:
        claims["exp"] = exp_ms // 1000
    server = PlainServer(validator)
    server.step(f"\x00{tenant}\x00token:{jwt.encode(claims, SECRET, algorithm='HS256')}"
                .encode())
    assert server.result is not None
    return server.result


def phase(state: ConnectionSasl) -> Phase:
    """The state's phase (a call, so that type checkers do not narrow it)."""
    return state.phase


def logged_in(state: ConnectionSasl, validator: JwtTokenValidator,
              exp_ms: int | None = None) -> int:
    assert state.handshake("PLAIN", 1, OFFERED) == Handshake.ACCEPTED
    state.begin(PlainServer(validator), 1)
    result = plain(validator, "acme", exp_ms=exp_ms)
    state.check(result)
    return state.succeeded(result, NOW)


def test_a_sasl_listener_is_gated_until_a_login(validator: JwtTokenValidator) -> None:
    state = ConnectionSasl(sasl_listener=True)
    assert phase(state) == Phase.NOT_LOGGED_IN and state.gated
    assert state.takes_authenticate()
    assert state.authenticating() is None  # SaslAuthenticate without a handshake
    assert state.handshake("PLAIN", 1, OFFERED) == Handshake.ACCEPTED
    state.begin(PlainServer(validator), 1)
    assert phase(state) == Phase.AUTHENTICATING and state.gated
    assert state.authenticating() is state.exchange is not None
    assert state.handshake("PLAIN", 1, OFFERED) == Handshake.DURING_EXCHANGE
    result = plain(validator, "acme")
    state.check(result)
    assert state.succeeded(result, NOW) == 0  # no expiry, no maximum: no limit
    assert phase(state) == Phase.LOGGED_IN and not state.gated
    assert state.login == result and state.exchange is None
    assert not state.takes_authenticate()  # after a login: ILLEGAL_SASL_STATE, stays
    assert not state.expired(NOW + 10**9)
    assert state.lifetime_left(NOW) == 0


def test_a_listener_without_sasl_refuses_handshakes_and_stays_open() -> None:
    state = ConnectionSasl(sasl_listener=False)
    assert not state.gated and not state.takes_authenticate()
    assert state.handshake("PLAIN", 1, OFFERED) == Handshake.NOT_NOW


def test_an_unknown_mechanism_is_unsupported() -> None:
    state = ConnectionSasl(sasl_listener=True)
    assert state.handshake("SCRAM-SHA-256", 1, OFFERED) == Handshake.UNSUPPORTED
    assert phase(state) == Phase.NOT_LOGGED_IN


def test_v0_handshake_switches_to_bare_tokens(validator: JwtTokenValidator) -> None:
    state = ConnectionSasl(sasl_listener=True)
    state.begin(PlainServer(validator), 0)
    assert state.raw_tokens
    assert state.authenticating() is None  # a SaslAuthenticate now is out of turn
    state.succeeded(plain(validator, "acme"), NOW)
    assert not state.raw_tokens and phase(state) == Phase.LOGGED_IN


def test_a_failed_exchange_ends_it(validator: JwtTokenValidator) -> None:
    state = ConnectionSasl(sasl_listener=True)
    state.begin(PlainServer(validator), 1)
    state.failed()
    assert phase(state) == Phase.NOT_LOGGED_IN and state.exchange is None


def test_session_lifetime_is_the_token_expiry_or_the_maximum(
        validator: JwtTokenValidator) -> None:
    state = ConnectionSasl(sasl_listener=True, max_reauth_ms=60_000)
    assert logged_in(state, validator, exp_ms=NOW + 30_000) == 30_000
    assert state.session_ends_ms == NOW + 30_000
    assert state.lifetime_left(NOW + 10_000) == 20_000
    assert state.lifetime_left(NOW + 40_000) == 1  # never 0, which would mean no limit
    assert not state.expired(NOW + 30_000) and state.expired(NOW + 30_001)
    capped = ConnectionSasl(sasl_listener=True, max_reauth_ms=60_000)
    assert logged_in(capped, validator) == 60_000


def test_reauthentication_same_mechanism_and_principal(validator: JwtTokenValidator) -> None:
    state = ConnectionSasl(sasl_listener=True, max_reauth_ms=60_000)
    logged_in(state, validator)
    first = state.login
    assert state.handshake("OAUTHBEARER", 1, OFFERED) == Handshake.WRONG_REAUTHENTICATION
    assert state.handshake("PLAIN", 0, OFFERED) == Handshake.WRONG_REAUTHENTICATION
    assert state.handshake("PLAIN", 1, OFFERED) == Handshake.ACCEPTED
    state.begin(PlainServer(validator), 1)
    assert phase(state) == Phase.REAUTHENTICATING
    assert not state.gated and state.takes_authenticate()
    with pytest.raises(SaslFailure, match="may not change the principal or tenant"):
        state.check(plain(validator, "other-tenant"))
    with pytest.raises(SaslFailure):
        state.check(plain(validator, "acme", role="mallory"))
    again = plain(validator, "acme")
    state.check(again)
    assert state.succeeded(again, NOW + 50_000) == 60_000
    assert state.session_ends_ms == NOW + 110_000
    assert state.login == again == first


def test_a_session_without_a_lifetime_cannot_reauthenticate(
        validator: JwtTokenValidator) -> None:
    state = ConnectionSasl(sasl_listener=True)
    logged_in(state, validator)
    assert state.handshake("PLAIN", 1, OFFERED) == Handshake.NOT_NOW


def test_one_api_versions_then_the_handshake_before_a_login(
        validator: JwtTokenValidator) -> None:
    """Kafka's SaslServerAuthenticator: ApiVersions at most once (one of a version not
    served does not count: the client retries lower), then SaslHandshake; another
    ApiVersions, one during the exchange, or any other request closes the connection."""
    state = ConnectionSasl(sasl_listener=True)
    assert state.before_login(api_versions=True, supported=False) is None  # v99: retried
    assert state.before_login(api_versions=True) is None
    assert state.before_login(api_versions=True) == "ApiVersions repeated before SaslHandshake"
    assert state.before_login(api_versions=False) == "request before SASL authentication"
    during = ConnectionSasl(sasl_listener=True)
    assert during.handshake("PLAIN", 1, OFFERED) == Handshake.ACCEPTED  # none asked first
    during.begin(PlainServer(validator), 1)
    assert during.before_login(api_versions=True) == "ApiVersions during a SASL exchange"


def test_an_expired_session_closes_on_any_request_but_a_reauthentication_begun_in_time(
        validator: JwtTokenValidator) -> None:
    """Kafka checks the expiry before anything else, SaslHandshake included; an exchange
    that began in time may finish (its SaslAuthenticate)."""
    state = ConnectionSasl(sasl_listener=True)
    logged_in(state, validator, exp_ms=NOW + 30_000)
    later = NOW + 30_001
    assert state.expired(later) and state.expired(later, authenticate=True)
    assert state.handshake("PLAIN", 1, OFFERED) == Handshake.ACCEPTED  # in time
    state.begin(PlainServer(validator), 1)
    assert state.expired(later) and not state.expired(later, authenticate=True)
