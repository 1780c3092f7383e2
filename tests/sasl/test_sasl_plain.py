"""PlainServer: RFC 4616 message rules, tenant usernames and the token: password method."""

from __future__ import annotations

import base64
import time

import jwt
import pytest

from oauth import JwtTokenValidator, TokenSettings
from sasl import MAX_CLIENT_MESSAGE_BYTES, Authenticated, PlainServer, SaslFailure

SECRET = b"plain-test-secret-plain-test-secret-plain-test-secret!!"


@pytest.fixture
def validator() -> JwtTokenValidator:
    url = f"data:;base64,{base64.b64encode(SECRET).decode()}"
    return JwtTokenValidator(TokenSettings(secret_key=url))


@pytest.fixture
def server(validator: JwtTokenValidator) -> PlainServer:
    return PlainServer(validator)


def token(**claims: object) -> str:
    return jwt.encode({"sub": "alice", **claims}, SECRET, algorithm="HS256")


def message(username: str, password: str, authzid: str = "") -> bytes:
    return f"{authzid}\x00{username}\x00{password}".encode()


def fails(server: PlainServer, msg: bytes) -> str:
    with pytest.raises(SaslFailure) as info:
        server.step(msg)
    assert not server.complete
    assert server.result is None
    return info.value.message


def test_tenant_login(server: PlainServer) -> None:
    exp = int(time.time()) + 300
    assert not server.complete and server.result is None
    assert server.mechanism == "PLAIN"
    assert server.step(message("acme", f"token:{token(exp=exp)}")) == b""
    assert server.complete
    assert server.result == Authenticated(
        principal="alice",
        tenant="acme",
        namespace=None,
        expires_at_ms=exp * 1000,
        mechanism="PLAIN",
        extensions={},
    )


def test_tenant_and_namespace(server: PlainServer) -> None:
    server.step(message("acme-1_x.y/ns.2", f"token:{token()}"))
    result = server.result
    assert result is not None
    assert (result.tenant, result.namespace) == ("acme-1_x.y", "ns.2")
    assert server.claimed_tenant == "acme-1_x.y"
    assert result.expires_at_ms is None


def test_the_reserved_namespace_is_refused(validator: JwtTokenValidator) -> None:
    """The broker's own namespace is no login's namespace, in any tenant; a tenant of that
    name, or a namespace that only resembles it, is fine."""
    for username in ("public/__kafka", "acme/__kafka"):
        reason = fails(PlainServer(validator, reserved_namespace="__kafka"),
                       message(username, f"token:{token()}"))
        assert reason == ("invalid username: namespace '__kafka' holds the broker's own "
                          "topics; name another namespace, or only the tenant")
    for username in ("__kafka", "acme/__kafka2", "acme/__KAFKA", "acme"):
        server = PlainServer(validator, reserved_namespace="__kafka")
        server.step(message(username, f"token:{token()}"))
        assert server.complete, username


def test_authzid_equal_to_username_accepted(server: PlainServer) -> None:
    server.step(message("acme/ns", f"token:{token()}", authzid="acme/ns"))
    assert server.complete


def test_authzid_different_rejected(server: PlainServer) -> None:
    assert "authorization id" in fails(server, message("acme", f"token:{token()}", authzid="other"))


@pytest.mark.parametrize(
    "msg",
    [b"", b"acme", b"acme\x00token:x", b"\x00acme\x00token:x\x00", b"a\x00b\x00c\x00d"],
)
def test_wrong_number_of_fields(server: PlainServer, msg: bytes) -> None:
    assert "3 fields" in fails(server, msg)


@pytest.mark.parametrize(
    "username", ["", "a/b/c", "acme/", "/ns", "ac me", "tenänt", "acme//ns", "a*b",
                 ".", "..", "./ns", "../ns", "acme/.", "acme/..", "a=b", "a:b", "acme\n"]
)
def test_bad_username(server: PlainServer, username: str) -> None:
    """Tenant and namespace follow the topic-name rule (``.``/``..`` would name
    directories and broke group and transaction requests)."""
    assert "invalid username" in fails(server, message(username, f"token:{token()}"))
    assert server.result is None


def test_failed_login_keeps_the_claimed_tenant_escaped_and_bounded(
        server: PlainServer) -> None:
    fails(server, message("acme/ns", "token:not.a.jwt"))
    assert server.claimed_tenant == "acme"
    other = PlainServer(server._validator)
    fails(other, message("evil\r\n" + "x" * 1000, "token:x"))
    claimed = other.claimed_tenant
    assert claimed is not None and claimed.startswith("evil\\r\\nxx") and len(claimed) < 300


def test_long_password_method_gives_a_bounded_reason(server: PlainServer) -> None:
    reason = fails(server, message("acme", "A" * 60_000 + ":x"))
    assert "unsupported authentication method" in reason and len(reason) <= 256


def test_non_token_method(server: PlainServer) -> None:
    reason = fails(server, message("acme", "password:hunter2"))
    assert "'password'" in reason and "'token'" in reason


def test_password_without_method(server: PlainServer) -> None:
    assert "token:<credential>" in fails(server, message("acme", token()))


def test_empty_token(server: PlainServer) -> None:
    assert "empty token" in fails(server, message("acme", "token:"))


def test_method_is_case_sensitive(server: PlainServer) -> None:
    assert "unsupported" in fails(server, message("acme", f"TOKEN:{token()}"))


def test_expired_token(server: PlainServer) -> None:
    expired = token(exp=int(time.time()) - 30)
    assert fails(server, message("acme", f"token:{expired}")) == "token expired"


def test_bad_token(server: PlainServer, validator: JwtTokenValidator) -> None:
    assert fails(server, message("acme", "token:not-a-jwt")) == "malformed token"
    other = PlainServer(validator)
    forged = jwt.encode({"sub": "root"}, b"x" * 64, algorithm="HS256")
    assert fails(other, message("acme", f"token:{forged}")) == "token signature invalid"


def test_invalid_utf8(server: PlainServer) -> None:
    assert "UTF-8" in fails(server, b"\x00acme\x00token:\xff\xfe")


def test_oversized_message(server: PlainServer) -> None:
    big = message("acme", "token:" + "a" * MAX_CLIENT_MESSAGE_BYTES)
    assert "too large" in fails(server, big)


def test_single_step_only(server: PlainServer, validator: JwtTokenValidator) -> None:
    server.step(message("acme", f"token:{token()}"))
    with pytest.raises(SaslFailure, match="single message"):
        server.step(message("acme", f"token:{token()}"))
    fresh = PlainServer(validator)
    fails(fresh, b"bad")
    with pytest.raises(SaslFailure, match="single message"):
        fresh.step(message("acme", f"token:{token()}"))


def test_tenant_claim_binds_the_login(validator: JwtTokenValidator) -> None:
    bound = token(tenant="acme")
    for username in ("acme", "acme/ns"):
        server = PlainServer(validator, tenant_claim="tenant")
        server.step(message(username, "token:" + bound))
        assert server.result is not None and server.result.tenant == "acme"
    refused = fails(PlainServer(validator, tenant_claim="tenant"),
                    message("victim", "token:" + bound))
    assert "not the one the token was issued for" in refused
    assert "invalid tenant in token claim" in fails(
        PlainServer(validator, tenant_claim="tenant"),
        message("acme", "token:" + token(tenant="a/b")))
    # Without the claim in the token, or without a claim configured: the username's.
    for server, credential in ((PlainServer(validator, tenant_claim="tenant"), token()),
                               (PlainServer(validator), bound)):
        server.step(message("victim", "token:" + credential))
        assert server.result is not None and server.result.tenant == "victim"
