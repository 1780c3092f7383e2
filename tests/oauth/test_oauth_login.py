"""The client-credentials login callback and its Kafka-client adapters, against the dev
issuer over HTTP on 127.0.0.1: discovery, caching, refresh at 80 % of the lifetime,
issuer errors, credentials URLs."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path

import jwt
import pytest
from kafka.net.sasl.oauth import AbstractTokenProvider as KafkaPythonProvider

from oauth.adapters import confluent_config, confluent_oauth_cb
from oauth.aiokafka_provider import AioKafkaTokenProvider
from oauth.credentials import ClientCredentials, load_credentials
from oauth.dev_issuer import DevIssuer
from oauth.errors import OAuthError
from oauth.kafka_python_provider import KafkaPythonTokenProvider
from oauth.login import ClientCredentialsLogin
from tests.oauth_helpers import AUDIENCE, credentials_url, issuer_count


@pytest.fixture(scope="module")
def issuer_options() -> dict[str, object]:
    """The dev issuer's options for this module."""
    return {"token_lifetime_seconds": 100}


class Clock:
    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def token_requests(issuer: DevIssuer) -> int:
    return issuer_count(issuer, "token_requests")


def test_token_is_discovered_fetched_and_cached(issuer: DevIssuer) -> None:
    login = ClientCredentialsLogin(issuer.url, credentials_url("app", "app-secret"),
                                   audience=AUDIENCE, scope="kafka write")
    before = token_requests(issuer)
    token = login.token()
    assert login.token() is token
    assert token_requests(issuer) == before + 1
    claims = jwt.decode(token.value, options={"verify_signature": False})
    assert claims["iss"] == issuer.url and claims["aud"] == AUDIENCE
    assert claims["scope"] == "kafka write" and token.scope == "kafka write"
    assert token.principal == "app"
    assert token.expires_at == pytest.approx(time.time() + 100, abs=3)
    assert "app-secret" not in repr(login.credentials) and token.value not in repr(token)


def test_refresh_at_eighty_percent_of_the_lifetime(issuer: DevIssuer) -> None:
    clock = Clock()
    login = ClientCredentialsLogin(issuer.url, credentials_url("app", "app-secret"),
                                   clock=clock)
    first = login.token()
    clock.offset = 78
    assert login.token() is first
    clock.offset = 81
    second = login.token()
    assert second is not first and second.obtained_at > first.obtained_at


def test_failed_refresh_keeps_a_valid_token_then_raises(issuer: DevIssuer) -> None:
    clock = Clock()
    login = ClientCredentialsLogin(issuer.url, credentials_url("app", "app-secret"),
                                   clock=clock, timeout_seconds=2)
    first = login.token()
    issuer.stop()
    try:
        clock.offset = 85
        assert login.token() is first
        clock.offset = 101
        with pytest.raises(OAuthError) as info:
            login.token()
        assert info.value.error == "request_failed"
        assert "cannot reach" in str(info.value)
    finally:
        issuer.start()
    assert login.token() is not first


@pytest.mark.parametrize("method", ["client_secret_basic", "client_secret_post", "auto"])
def test_client_authentication_methods(issuer: DevIssuer, method: str) -> None:
    login = ClientCredentialsLogin(issuer.url, credentials_url("app", "app-secret"),
                                   auth_method=method)
    assert login.token().principal == "app"


def test_token_endpoint_given_directly(issuer: DevIssuer) -> None:
    before = issuer_count(issuer, "discovery_requests")
    login = ClientCredentialsLogin(issuer.url, credentials_url("app", "app-secret"),
                                   token_endpoint=f"{issuer.url}/token",
                                   auth_method="client_secret_post")
    assert login.token().principal == "app"
    assert issuer_count(issuer, "discovery_requests") == before


@pytest.mark.parametrize(("client_id", "secret", "audience", "expected"), [
    ("app", "nope", None, "invalid_client: bad secret"),
    ("ghost", "x", None, "invalid_client: unknown client"),
    ("app", "app-secret", "elsewhere", "invalid_target: unknown audience 'elsewhere'"),
])
def test_issuer_errors_carry_error_and_description(
        issuer: DevIssuer, client_id: str, secret: str, audience: str | None,
        expected: str) -> None:
    login = ClientCredentialsLogin(issuer.url, credentials_url(client_id, secret),
                                   audience=audience)
    with pytest.raises(OAuthError) as info:
        login.token()
    assert str(info.value) == expected
    assert f"{info.value.error}: {info.value.description}" == expected


def test_unreachable_issuer() -> None:
    login = ClientCredentialsLogin("http://127.0.0.1:9", credentials_url("a", "b"),
                                   timeout_seconds=2)
    with pytest.raises(OAuthError, match="request_failed: OIDC discovery failed"):
        login.token()


def test_credentials_urls(tmp_path: Path) -> None:
    document = {"client_id": "c", "client_secret": "s", "tenant": "t", "group_id": "g"}
    path = tmp_path / "creds.json"
    path.write_text(json.dumps(document))
    expected = ClientCredentials("c", "s", "t", "g")
    for url in (path.as_uri(), f"file:{path}", str(path),
                "data:application/json;base64," + base64.b64encode(path.read_bytes()).decode()):
        assert load_credentials(url) == expected
    assert expected.extensions() == {"tenant": "t", "groupId": "g"}
    assert ClientCredentials("c", "s").extensions() == {}


@pytest.mark.parametrize(("content", "fragment"), [
    ('{"client_id": "c"}', "'client_secret' must be a non-empty string"),
    ('{"client_id": "", "client_secret": "s"}', "'client_id' must be a non-empty string"),
    ('{"client_id": "c", "client_secret": "s", "tenant": 5}', "'tenant' must be a string"),
    ("[1]", "not a JSON object"),
    ("client_id=c", "not JSON"),
])
def test_bad_credentials(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "creds.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=fragment):
        load_credentials(path.as_uri())
    with pytest.raises(ValueError, match="cannot read credentials"):
        load_credentials(str(tmp_path / "missing.json"))


def test_credentials_file_is_read_again_on_refresh(issuer: DevIssuer, tmp_path: Path) -> None:
    path = tmp_path / "creds.json"
    path.write_text(json.dumps({"client_id": "app", "client_secret": "app-secret"}))
    login = ClientCredentialsLogin(issuer.url, path.as_uri())
    login.token()
    path.write_text(json.dumps({"client_id": "app", "client_secret": "rotated"}))
    login.invalidate()
    with pytest.raises(OAuthError, match="bad secret"):
        login.token()


def test_adapters(issuer: DevIssuer) -> None:
    login = ClientCredentialsLogin(
        issuer.url, credentials_url("acme-app", "acme-secret", tenant="acme",
                                    group_id="billing"))
    token, expiry, principal, extensions = confluent_oauth_cb(login)("ignored config")
    assert token == login.token().value
    assert isinstance(expiry, float) and expiry == login.token().expires_at
    assert principal == "acme-app"
    assert extensions == {"tenant": "acme", "groupId": "billing"}
    assert jwt.decode(token, options={"verify_signature": False})["tenant"] == "acme"
    conf = confluent_config(login)
    assert conf["sasl.mechanisms"] == "OAUTHBEARER" and callable(conf["oauth_cb"])

    sync_provider = KafkaPythonTokenProvider(login)
    assert isinstance(sync_provider, KafkaPythonProvider)
    assert sync_provider.token() == token
    assert sync_provider.extensions() == extensions

    async_provider = AioKafkaTokenProvider(login)
    assert asyncio.run(async_provider.token()) == token
    assert async_provider.extensions() == extensions


def test_constructor_checks() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        ClientCredentialsLogin("http://127.0.0.1:1")
    with pytest.raises(ValueError, match="issuer URL"):
        ClientCredentialsLogin("127.0.0.1:1", credentials=ClientCredentials("a", "b"))
    with pytest.raises(ValueError, match="auth_method"):
        ClientCredentialsLogin("http://127.0.0.1:1", credentials=ClientCredentials("a", "b"),
                               auth_method="private_key_jwt")
