"""The development issuer over HTTP: discovery, JWKS, the client-credentials token
endpoint and its errors, key rotation with a grace period, request counts."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote_plus, urlencode

import jwt
import pytest

from oauth.dev_issuer import DevClient, DevIssuer, parse_client_spec
from tests.oauth_helpers import make_issuer


@pytest.fixture
def issuer() -> Iterator[DevIssuer]:
    dev = make_issuer(clients=[DevClient("app", "s:e+c r%t"), DevClient("acme", "x", "acme")])
    yield dev
    dev.stop()


def call(url: str, body: bytes | None = None, headers: dict[str, str] | None = None,
         content_type: str = "application/x-www-form-urlencoded") -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, headers=headers or {})
    if body is not None:
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def basic(client_id: str, secret: str, encode: bool = True) -> dict[str, str]:
    pair = f"{quote_plus(client_id)}:{quote_plus(secret)}" if encode else f"{client_id}:{secret}"
    return {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}


def grant(**fields: str) -> bytes:
    return urlencode({"grant_type": "client_credentials", **fields}).encode()


def test_discovery_and_jwks(issuer: DevIssuer) -> None:
    status, document = call(f"{issuer.url}/.well-known/openid-configuration")
    assert status == 200
    assert document["issuer"] == issuer.url
    assert document["jwks_uri"] == f"{issuer.url}/jwks"
    assert document["token_endpoint"] == f"{issuer.url}/token"
    status, jwks = call(document["jwks_uri"])
    assert status == 200
    (key,) = jwks["keys"]
    assert key["kid"] == issuer.keys.current.kid and key["kty"] == "RSA"
    assert "d" not in key and "p" not in key
    stats = issuer.stats()
    assert (stats["discovery_requests"], stats["jwks_requests"]) == (1, 1)


@pytest.mark.parametrize("encode", [True, False])
def test_token_with_basic_auth_and_tenant_claim(issuer: DevIssuer, encode: bool) -> None:
    status, body = call(f"{issuer.url}/token", grant(scope="kafka  write"),
                        basic("app", "s:e+c r%t", encode))
    assert status == 200, body
    assert body["token_type"] == "Bearer" and body["expires_in"] == 3600
    assert body["scope"] == "kafka write"
    claims = jwt.decode(body["access_token"], options={"verify_signature": False})
    assert claims["sub"] == "app" and claims["client_id"] == "app"
    assert "tenant" not in claims
    header = jwt.get_unverified_header(body["access_token"])
    assert header["kid"] == issuer.keys.current.kid and header["alg"] == "RS256"
    status, body = call(f"{issuer.url}/token", grant(client_id="acme", client_secret="x"))
    assert status == 200
    assert jwt.decode(body["access_token"], options={"verify_signature": False})[
        "tenant"] == "acme"


@pytest.mark.parametrize(("body", "headers", "status", "error"), [
    (urlencode({"scope": "x"}).encode(), basic("acme", "x"), 400, "invalid_request"),
    (grant(grant_type="password"), basic("acme", "x"), 400, "unsupported_grant_type"),
    (grant(), {}, 401, "invalid_client"),
    (grant(), basic("acme", "wrong"), 401, "invalid_client"),
    (grant(), {"Authorization": "Bearer abc"}, 401, "invalid_client"),
    (grant(), {"Authorization": "Basic !!!"}, 401, "invalid_client"),
    (grant(client_id="acme", client_secret="x"), basic("acme", "x"), 400, "invalid_request"),
    (b"grant_type=client_credentials&grant_type=client_credentials", basic("acme", "x"), 400,
     "invalid_request"),
    (grant(audience="other"), basic("acme", "x"), 400, "invalid_target"),
])
def test_token_errors(issuer: DevIssuer, body: bytes, headers: dict[str, str], status: int,
                      error: str) -> None:
    got_status, answer = call(f"{issuer.url}/token", body, headers)
    assert (got_status, answer["error"]) == (status, error), answer
    assert answer.get("error_description")


def test_token_needs_a_form_body(issuer: DevIssuer) -> None:
    status, answer = call(f"{issuer.url}/token", b'{"grant_type": "client_credentials"}',
                          basic("acme", "x"), content_type="application/json")
    assert (status, answer["error"]) == (400, "invalid_request")
    assert call(f"{issuer.url}/nowhere")[0] == 404


def test_rotation_keeps_the_old_key_for_the_grace_period() -> None:
    issuer = make_issuer(key_grace_seconds=0.5)
    try:
        old = str(issuer.keys.current.kid)
        status, body = call(f"{issuer.url}/rotate", b"")
        assert status == 200 and body["kid"] != old
        assert issuer.stats()["kids"] == [body["kid"], old]
        time.sleep(0.6)
        assert issuer.stats()["kids"] == [body["kid"]]
        status, dropped = call(f"{issuer.url}/rotate?drop_previous=true", b"")
        assert issuer.stats()["kids"] == [dropped["kid"]]
        assert issuer.stats()["rotations"] == 2
    finally:
        issuer.stop()


def test_restart_keeps_port_and_keys() -> None:
    issuer = make_issuer()
    try:
        port, kid = issuer.port, issuer.keys.current.kid
        issuer.stop()
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"{issuer.url}/jwks", timeout=2)
        issuer.start()
        assert issuer.port == port
        assert call(f"{issuer.url}/jwks")[1]["keys"][0]["kid"] == kid
    finally:
        issuer.stop()


def test_client_specs_and_loopback_only() -> None:
    assert parse_client_spec("a:b") == DevClient("a", "b")
    assert parse_client_spec("a:b:acme") == DevClient("a", "b", "acme")
    for bad in ("a", "a:", ":b", "a:b:c:d"):
        with pytest.raises(ValueError, match="id:secret"):
            parse_client_spec(bad)
    with pytest.raises(ValueError, match="loopback"):
        DevIssuer(host="0.0.0.0")
