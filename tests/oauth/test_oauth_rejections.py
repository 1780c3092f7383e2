"""OAuth acceptance 4: bad OAUTHBEARER logins are refused the RFC 7628 way — the first
SaslAuthenticate answer carries ``{"status":"invalid_token"}``, the client's ``\\x01``
reply gets SASL_AUTHENTICATION_FAILED (58) — and the broker is unharmed: a good login
still works after each of them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import jwt
import pytest
from joserfc.jwk import RSAKey

from oauth.dev_issuer import DevIssuer
from tests.broker_process import BrokerProcess
from tests.oauth_helpers import (
    bearer_message,
    good_login,
    issuer_token,
    rejected,
)

SCOPE = "kafka"


@pytest.fixture(scope="module")
def oauth_options() -> dict[str, str]:
    """The broker's ``oauth.*`` keys for this module."""
    return {"required_scopes": SCOPE}


@pytest.fixture(scope="module")
def oauth_broker_settings() -> dict[str, str]:
    """The broker's own settings for this module."""
    # every rejected login here comes from 127.0.0.1: each one is reported, none counted
    return {"failedAuthenticationDelayMs": "0", "auditDenialsPerWindow": "100000"}


def good(issuer: DevIssuer) -> str:
    return issuer_token(issuer, "app", scope=SCOPE)


def foreign_key_token(issuer: DevIssuer) -> str:
    """Signed by a key the issuer does not publish, under the issuer's current kid."""
    stranger = RSAKey.generate_key(2048, parameters={"alg": "RS256"})
    claims = issuer.claims_for(issuer.clients["app"], SCOPE)
    return issuer.sign(claims, key=stranger, kid=str(issuer.keys.current.kid))


def tampered_token(issuer: DevIssuer) -> str:
    header, _payload, signature = good(issuer).split(".")
    other = good(issuer).split(".")[1]
    forged = issuer_token(issuer, "admin", scope=SCOPE).split(".")[1]
    assert forged != other
    return ".".join([header, forged, signature])


def hmac_token(issuer: DevIssuer) -> str:
    claims = issuer.claims_for(issuer.clients["app"], SCOPE)
    return jwt.encode(claims, "a-shared-secret-that-is-long-enough!!", algorithm="HS256",
                      headers={"kid": str(issuer.keys.current.kid)})


def none_token(issuer: DevIssuer) -> str:
    claims = issuer.claims_for(issuer.clients["app"], SCOPE)
    return jwt.encode(claims, None, algorithm="none")


Case = Callable[[DevIssuer], bytes]
CASES: dict[str, tuple[Case, str]] = {
    "expired": (lambda i: bearer_message(issuer_token(
        i, scope=SCOPE, exp=int(time.time()) - 120)), "token expired"),
    "not-yet-valid": (lambda i: bearer_message(issuer_token(
        i, scope=SCOPE, nbf=int(time.time()) + 600)), "token not valid yet"),
    "wrong-issuer": (lambda i: bearer_message(issuer_token(
        i, scope=SCOPE, iss="http://127.0.0.1:1/other")), "token issuer mismatch"),
    "wrong-audience": (lambda i: bearer_message(issuer_token(
        i, scope=SCOPE, aud="someone-else")), "token audience mismatch"),
    "missing-scope": (lambda i: bearer_message(issuer_token(i, scope="read")),
                      "token lacks required scope 'kafka'"),
    "no-exp": (lambda i: bearer_message(issuer_token(i, scope=SCOPE, exp=None)),
               "token has no 'exp' claim"),
    "no-principal": (lambda i: bearer_message(issuer_token(i, scope=SCOPE, sub=None)),
                     "token has no 'sub' claim"),
    "bad-signature": (lambda i: bearer_message(foreign_key_token(i)),
                      "token signature invalid"),
    "tampered-payload": (lambda i: bearer_message(tampered_token(i)),
                         "token signature invalid"),
    "hmac-algorithm": (lambda i: bearer_message(hmac_token(i)),
                       "token algorithm 'HS256' not allowed"),
    "none-algorithm": (lambda i: bearer_message(none_token(i)),
                       "token algorithm 'none' not allowed"),
    "not-a-jwt": (lambda i: bearer_message("not.a.jwt"), "malformed token"),
    "authzid-mismatch": (lambda i: bearer_message(good(i), header="n,a=mallory,"),
                         "authorization id does not match"),
    "malformed-gs2-header": (lambda i: bearer_message(good(i), header="y,,"),
                             "channel binding is not supported"),
    "gs2-header-garbage": (lambda i: b"hello\x01auth=Bearer x\x01\x01",
                           "invalid GS2 header"),
    "missing-auth": (lambda i: b"n,,\x01groupId=g\x01\x01", "missing 'auth' key"),
    "bad-tenant-extension": (lambda i: bearer_message(good(i), tenant="a b"),
                             "invalid tenant"),
    "absurdly-long-token": (lambda i: bearer_message("a" * (256 * 1024)),
                            "SASL message too large"),
    "not-utf8": (lambda i: b"n,,\x01auth=Bearer \xff\xfe\x01\x01", "not valid UTF-8"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rejected_then_broker_unharmed(broker: BrokerProcess, issuer: DevIssuer,
                                       case: str) -> None:
    make, reason = CASES[case]
    message = rejected(broker.port, make(issuer))
    assert message.startswith("Authentication failed: "), message
    assert reason in message, message
    broker.wait_for_log("failed: .*" + reason.split("'")[0])
    assert good_login(broker.port, good(issuer)).error_code == 0
    assert broker.alive()


def test_unknown_kid_is_rejected(broker: BrokerProcess, issuer: DevIssuer) -> None:
    claims = issuer.claims_for(issuer.clients["app"], SCOPE)
    stranger = RSAKey.generate_key(2048, parameters={"alg": "RS256"})
    token = issuer.sign(claims, key=stranger, kid=uuid.uuid4().hex)
    assert "token signed with an unknown key" in rejected(broker.port, bearer_message(token))


def test_session_lifetime_is_the_token_lifetime(broker: BrokerProcess,
                                                issuer: DevIssuer) -> None:
    exp = int(time.time()) + 120
    answer = good_login(broker.port, issuer_token(issuer, scope=SCOPE, exp=exp))
    assert 100_000 < answer.session_lifetime_ms <= 120_000
