"""JwksTokenValidator against the dev issuer over HTTP: discovery or a configured JWKS URL,
claims checks (issuer, audiences, scopes in ``scope`` or ``scp``, principal claim, skew),
and the OAUTHBEARER server built on it (tenant, extensions, authorization id)."""

from __future__ import annotations

import threading
import time

import pytest

from common.json_types import JsonObject
from oauth.dev_issuer import DevIssuer
from oauth.errors import KeysUnavailable, TokenInvalid
from oauth.jwks import JwksCache
from oauth.jwks_validator import IssuerKeysLoader, JwksTokenValidator, granted_scopes
from oauth.settings import ValidatorSettings
from sasl.errors import SaslFailure, SaslPending
from sasl.oauthbearer import OAuthBearerServer
from sasl.plain import PlainServer
from tests.oauth_helpers import (
    AUDIENCE,
    ERROR_CHALLENGE,
    bearer_message,
    issuer_token,
    make_issuer,
)


def fetched(check: JwksTokenValidator) -> JwksTokenValidator:
    """``check`` once its first key fetch is over (a token check never waits for it)."""
    check.warm_up()
    assert check.keys.wait_for_fetch(10)
    return check


def validator(issuer: DevIssuer, **options: object) -> JwksTokenValidator:
    fields: dict[str, object] = {"issuer_url": issuer.url, "audiences": (AUDIENCE,),
                                 **options}
    return fetched(JwksTokenValidator(ValidatorSettings(**fields)))  # type: ignore[arg-type]


def test_accepts_an_issued_token(issuer: DevIssuer) -> None:
    exp = int(time.time()) + 60
    result = validator(issuer).validate(issuer_token(issuer, "acme-app", exp=exp))
    assert result.principal == "acme-app"
    assert result.expires_at_ms == exp * 1000
    assert result.claims["tenant"] == "acme"


def test_configured_jwks_url_without_issuer_check(issuer: DevIssuer) -> None:
    check = fetched(JwksTokenValidator(ValidatorSettings(jwks_url=f"{issuer.url}/jwks")))
    assert check.validate(issuer_token(issuer, iss="anyone")).principal == "app"


def test_audiences_scopes_and_principal_claim(issuer: DevIssuer) -> None:
    check = validator(issuer, audiences=("other", AUDIENCE),
                      required_scopes=("kafka.read", "kafka.write"), principal_claim="client_id")
    assert check.validate(issuer_token(
        issuer, scope="kafka.write kafka.read", aud=["x", AUDIENCE])).principal == "app"
    assert check.validate(issuer_token(
        issuer, scp=["kafka.read", "kafka.write"])).principal == "app"
    with pytest.raises(TokenInvalid, match=r"required scope 'kafka\.write'"):
        check.validate(issuer_token(issuer, scp=["kafka.read"]))
    with pytest.raises(TokenInvalid, match="audience mismatch"):
        check.validate(issuer_token(issuer, scope="kafka.read kafka.write", aud=["x", 3]))
    with pytest.raises(TokenInvalid, match="no 'client_id' claim"):
        check.validate(issuer_token(issuer, scope="kafka.read kafka.write", client_id=""))
    assert granted_scopes({"scope": "a b", "scp": ["c", 1], "other": "d"}) == {"a", "b", "c"}


def test_clock_skew(issuer: DevIssuer) -> None:
    recent = issuer_token(issuer, exp=int(time.time()) - 5)
    assert validator(issuer, clock_skew_seconds=30).validate(recent).principal == "app"
    with pytest.raises(TokenInvalid, match="expired"):
        validator(issuer, clock_skew_seconds=0).validate(recent)


@pytest.mark.parametrize(("name", "value"), [
    ("exp", 10**17), ("exp", 10**400), ("exp", 1e306), ("iat", 10**400), ("nbf", -(10**17))],
    ids=["exp year 3e9", "exp 10**400", "exp 1e306", "iat", "nbf"])
def test_a_time_past_the_year_9999_is_malformed(issuer: DevIssuer, name: str,
                                                value: float) -> None:
    """(A float or int64 overflow broke the connection instead of refusing the login.)"""
    token = issuer_token(issuer, "app", None, **{name: value})
    with pytest.raises(TokenInvalid, match=f"malformed token: '{name}' is out of range"):
        validator(issuer).validate(token)


def test_algorithm_allow_list(issuer: DevIssuer) -> None:
    with pytest.raises(TokenInvalid, match="'RS256' not allowed"):
        validator(issuer, algorithms=("ES256",)).validate(issuer_token(issuer))


def test_unreachable_issuer_is_a_clear_rejection() -> None:
    check = JwksTokenValidator(ValidatorSettings(issuer_url="http://127.0.0.1:9",
                                                 http_timeout_seconds=2))
    dev = make_issuer()
    dev.stop()
    with pytest.raises(KeysUnavailable, match="signing keys are unavailable"):
        check.validate(issuer_token(dev))


def test_bearer_server_with_the_validator(issuer: DevIssuer) -> None:
    check = validator(issuer)
    server = OAuthBearerServer(check, tenant_claim="tenant")
    assert server.step(bearer_message(issuer_token(issuer, "acme-app"), header="n,a=acme-app,",
                                      groupId="billing", tenant="acme")) == b""
    assert server.result is not None
    assert (server.result.principal, server.result.tenant) == ("acme-app", "acme")
    assert dict(server.result.extensions) == {"groupId": "billing", "tenant": "acme"}
    server = OAuthBearerServer(check, tenant_claim="tenant")
    server.step(bearer_message(issuer_token(issuer, "app"), tenant="globex"))
    assert server.result is not None and server.result.tenant == "globex"
    server = OAuthBearerServer(check, tenant_claim="tenant")
    assert server.step(bearer_message(issuer_token(issuer), header="n,a=bob,")) != b""
    with pytest.raises(SaslFailure, match="authorization id"):
        server.step(b"\x01")


def test_a_login_before_the_first_keys_is_pending_once(issuer: DevIssuer) -> None:
    """Before the first keys, a mechanism's step is SaslPending (not a step: the session
    waits, then gives the message again); the second time it is judged: refused while the
    fetch still hangs, accepted once it has landed. PLAIN shares the rule."""
    settings = ValidatorSettings(issuer_url=issuer.url, audiences=(AUDIENCE,))
    answer = threading.Event()
    loader = IssuerKeysLoader(settings)

    def hanging() -> JsonObject:
        answer.wait(30)
        return loader()

    check = JwksTokenValidator(settings, keys=JwksCache(hanging, first_wait_seconds=0.5))
    message = bearer_message(issuer_token(issuer))
    early, later = OAuthBearerServer(check), OAuthBearerServer(check)
    for server in (early, later):
        with pytest.raises(SaslPending) as pending:
            server.step(message)
        assert not pending.value.ready.done() and pending.value.wait_seconds == 0.5
        assert server.refused is None and not server.complete
    assert early.step(message) == ERROR_CHALLENGE  # the fetch still hangs: refused
    assert early.refused is not None and "signing keys are unavailable" in early.refused
    answer.set()
    pending.value.ready.result(10)
    assert later.step(message) == b""
    assert later.result is not None and later.result.principal == "app"

    plain = PlainServer(JwksTokenValidator(settings))
    credentials = f"\x00public\x00token:{issuer_token(issuer)}".encode()
    with pytest.raises(SaslPending) as pending:
        plain.step(credentials)
    pending.value.ready.result(10)
    assert plain.step(credentials) == b"" and plain.complete
