"""OAuthBearerServer: RFC 7628 client response parsing, error challenge, tenant, authzid."""

from __future__ import annotations

import base64
import time

import jwt
import pytest

from oauth import JwtTokenValidator, TokenSettings
from sasl import MAX_CLIENT_MESSAGE_BYTES, OAuthBearerServer, SaslFailure

SECRET = b"bearer-test-secret-bearer-test-secret-bearer-test-secret"
ERROR = b'{"status":"invalid_token"}'


@pytest.fixture
def validator() -> JwtTokenValidator:
    url = f"data:application/octet-stream;base64,{base64.b64encode(SECRET).decode()}"
    return JwtTokenValidator(TokenSettings(secret_key=url))


@pytest.fixture
def server(validator: JwtTokenValidator) -> OAuthBearerServer:
    return OAuthBearerServer(validator)


def token(**claims: object) -> str:
    return jwt.encode({"sub": "alice", **claims}, SECRET, algorithm="HS256")


def message(tok: str, header: str = "n,,", **extensions: str) -> bytes:
    pairs = "".join(f"{k}={v}\x01" for k, v in extensions.items())
    return f"{header}\x01auth=Bearer {tok}\x01{pairs}\x01".encode()


def fails_after_challenge(server: OAuthBearerServer, msg: bytes) -> str:
    assert server.refused is None
    assert server.step(msg) == ERROR
    assert not server.complete
    assert server.result is None
    refused = server.refused  # the login failed as the challenge was answered
    assert refused
    with pytest.raises(SaslFailure) as info:
        server.step(b"\x01")
    assert not server.complete
    assert info.value.message == refused
    return info.value.message


def test_good_message_with_extensions(server: OAuthBearerServer) -> None:
    exp = int(time.time()) + 120
    assert server.mechanism == "OAUTHBEARER"
    assert server.step(message(token(exp=exp), groupId="g1", traceId="t 1")) == b""
    assert server.complete
    result = server.result
    assert result is not None
    assert result.principal == "alice"
    assert result.tenant is None
    assert result.namespace is None
    assert result.expires_at_ms == exp * 1000
    assert result.mechanism == "OAUTHBEARER"
    assert dict(result.extensions) == {"groupId": "g1", "traceId": "t 1"}


def test_minimal_message_and_lowercase_scheme(server: OAuthBearerServer) -> None:
    assert server.step(f"n,,\x01auth=bearer {token()}\x01\x01".encode()) == b""
    assert server.result is not None and server.result.extensions == {}


def test_tenant_from_extension(server: OAuthBearerServer) -> None:
    server.step(message(token(), tenant="acme", groupId="g"))
    assert server.result is not None and server.result.tenant == "acme"


def test_tenant_claim_binds_the_login(validator: JwtTokenValidator) -> None:
    for extensions in ({}, {"tenant": "from-claim"}):
        server = OAuthBearerServer(validator, tenant_claim="tenant")
        server.step(message(token(tenant="from-claim"), **extensions))
        assert server.result is not None and server.result.tenant == "from-claim"
    server = OAuthBearerServer(validator, tenant_claim="tenant")
    assert "not the one the token was issued for" in fails_after_challenge(
        server, message(token(tenant="from-claim"), tenant="from-ext"))
    # A token without the claim: the extension names the tenant (the README's fallback).
    server = OAuthBearerServer(validator, tenant_claim="tenant")
    server.step(message(token(), tenant="from-ext"))
    assert server.result is not None and server.result.tenant == "from-ext"


@pytest.mark.parametrize("claims", [{"tenant": "a/b"}, {"tenant": 5}, {"tenant": ""}])
def test_bad_tenant_claim(validator: JwtTokenValidator, claims: dict[str, object]) -> None:
    server = OAuthBearerServer(validator, tenant_claim="tenant")
    assert "invalid tenant" in fails_after_challenge(server, message(token(**claims)))


def test_bad_tenant_extension(server: OAuthBearerServer) -> None:
    assert "invalid tenant" in fails_after_challenge(server, message(token(), tenant="a b"))


def test_authzid_matching_principal(server: OAuthBearerServer) -> None:
    assert server.step(message(token(), header="n,a=alice,")) == b""
    assert server.complete


def test_authzid_escapes(validator: JwtTokenValidator) -> None:
    server = OAuthBearerServer(validator)
    server.step(message(token(sub="a,b=c"), header="n,a=a=2Cb=3Dc,"))
    assert server.result is not None and server.result.principal == "a,b=c"


def test_authzid_mismatch(server: OAuthBearerServer) -> None:
    reason = fails_after_challenge(server, message(token(), header="n,a=mallory,"))
    assert "authorization id" in reason


@pytest.mark.parametrize(
    "header",
    ["y,,", "p=tls-unique,,", "x,,", "n", "n,a=alice", "n,b=alice,", "n,a=,", "n,a=a=2Db,", ""],
)
def test_bad_gs2_header_gets_error_challenge(server: OAuthBearerServer, header: str) -> None:
    fails_after_challenge(server, message(token(), header=header))


@pytest.mark.parametrize(
    ("msg", "reason"),
    [
        (b"n,,\x01\x01", "missing 'auth'"),
        (b"n,,\x01groupId=g\x01\x01", "missing 'auth'"),
        (b"n,,\x01auth=Basic abc\x01\x01", "Bearer"),
        (b"n,,\x01auth=Bearer \x01\x01", "Bearer"),
        (b"n,,\x01auth=Bearer a b\x01\x01", "Bearer"),
        (b"n,,\x01auth=Bearer abc\x01", "separator"),
        (b"n,,\x01auth=Bearer abc", "framing"),
        (b"n,,auth=Bearer abc\x01\x01", "framing"),
        (b"n,,\x01auth=Bearer abc\x01\x01\x01", "pair"),
        (b"n,,\x01auth=Bearer abc\x01gr0up=x\x01\x01", "pair"),
        (b"n,,\x01auth=Bearer abc\x01=x\x01\x01", "pair"),
        (b"n,,\x01auth=Bearer abc\x01groupId\x01\x01", "pair"),
        (b"n,,\x01auth=Bearer abc\x01groupId=\x00\x01\x01", "bad value"),
        (b"n,,\x01auth=Bearer abc\x01k=a\x01k=b\x01\x01", "duplicate"),
        (b"n,,\x01auth=Bearer abc\x01auth=Bearer abc\x01\x01", "duplicate"),
        ("n,,\x01auth=Bearer abc\x01k=é\x01\x01".encode(), "bad value"),
    ],
)
def test_malformed_after_header_gets_error_challenge(
    server: OAuthBearerServer, msg: bytes, reason: str
) -> None:
    assert reason in fails_after_challenge(server, msg)


def test_invalid_token_challenge_then_failure(server: OAuthBearerServer) -> None:
    expired = token(exp=int(time.time()) - 10)
    assert fails_after_challenge(server, message(expired)) == "token expired"
    with pytest.raises(SaslFailure, match="already over"):
        server.step(b"\x01")


def test_failure_reason_kept_whatever_the_reply(server: OAuthBearerServer) -> None:
    assert server.step(message("garbage")) == ERROR
    with pytest.raises(SaslFailure, match="malformed token"):
        server.step(b"something else")


def test_other_failures(server: OAuthBearerServer, validator: JwtTokenValidator) -> None:
    assert "UTF-8" in fails_after_challenge(server, b"n,,\x01auth=Bearer \xff\x01\x01")
    big = message("a" * MAX_CLIENT_MESSAGE_BYTES)
    assert "too large" in fails_after_challenge(OAuthBearerServer(validator), big)


def test_no_step_after_success(server: OAuthBearerServer) -> None:
    server.step(message(token()))
    with pytest.raises(SaslFailure, match="already over"):
        server.step(b"\x01")


@pytest.mark.parametrize("tenant", [".", "..", "a:b", "a=b"])
def test_dot_and_punctuation_tenants_are_refused(server: OAuthBearerServer,
                                                 tenant: str) -> None:
    assert "invalid tenant" in fails_after_challenge(server, message(token(), tenant=tenant))


def test_the_claimed_tenant_outlives_a_refused_token(server: OAuthBearerServer) -> None:
    fails_after_challenge(server, message("not.a.token", tenant="acme\r\nx"))
    assert server.claimed_tenant == "acme\\r\\nx"


def test_a_tenant_claim_is_the_claimed_tenant(validator: JwtTokenValidator) -> None:
    server = OAuthBearerServer(validator, tenant_claim="tenant")
    server.step(message(token(tenant="from-claim"), tenant="from-ext"))  # refused
    assert server.claimed_tenant == "from-claim"
