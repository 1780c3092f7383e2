"""The OAUTHBEARER validator settings (``oauth.*`` keys of ``kopOauth2ConfigFile``): parsing,
defaults, refusals naming the key, and the broker refusing to start on a bad file."""

from __future__ import annotations

import base64
import subprocess
import sys
import time
from pathlib import Path

import jwt
import pytest

from oauth.errors import OAuthConfigError
from oauth.settings import (
    DEFAULT_ALGORITHMS,
    SETTING_KEYS,
    ValidatorSettings,
    parse_validator_settings,
    settings_reference_markdown,
)
from tests.broker_process import REPO, refused_to_start
from tests.oauth_helpers import (
    bearer_message,
    good_login,
    issuer_token,
    make_issuer,
    rejected,
    start_broker,
)

ISSUER = "http://127.0.0.1:8080"


def test_defaults() -> None:
    settings = parse_validator_settings({"oauth.issuer.url": ISSUER})
    assert settings == ValidatorSettings(issuer_url=ISSUER)
    assert settings.method == "jwks"
    assert settings.principal_claim == "sub"
    assert settings.tenant_claim is None
    assert settings.required_scopes == ()
    assert settings.clock_skew_seconds == 30
    assert settings.algorithms == DEFAULT_ALGORITHMS
    assert settings.jwks_refresh_min_seconds == 10


def test_every_key() -> None:
    settings = parse_validator_settings({
        "oauth.validate.method": "JWKS",
        "oauth.issuer.url": ISSUER,
        "oauth.jwks.url": " https://idp.example/keys ",
        "oauth.audience": "kafka, edge-broker,kafka",
        "oauth.principal.claim": "client_id",
        "oauth.tenant.claim": "tenant",
        "oauth.required.scopes": "kafka.write, kafka.read kafka.write",
        "oauth.clock.skew.seconds": "5",
        "oauth.algorithms": "ES256,RS256",
        "oauth.jwks.refresh.min.seconds": "2.5",
        "oauth.jwks.retry.seconds": "0.5",
        "oauth.jwks.max.age.seconds": "600",
        "oauth.http.timeout.seconds": "3",
    })
    assert settings == ValidatorSettings(
        method="jwks", issuer_url=ISSUER, jwks_url="https://idp.example/keys",
        audiences=("kafka", "edge-broker"), principal_claim="client_id", tenant_claim="tenant",
        required_scopes=("kafka.write", "kafka.read"), clock_skew_seconds=5,
        algorithms=("ES256", "RS256"), jwks_refresh_min_seconds=2.5, jwks_retry_seconds=0.5,
        jwks_max_age_seconds=600, http_timeout_seconds=3)
    assert {key.name for key in SETTING_KEYS} == {
        "oauth.validate.method", "oauth.issuer.url", "oauth.jwks.url", "oauth.audience",
        "oauth.principal.claim", "oauth.tenant.claim", "oauth.required.scopes",
        "oauth.clock.skew.seconds", "oauth.algorithms", "oauth.jwks.refresh.min.seconds",
        "oauth.jwks.retry.seconds", "oauth.jwks.max.age.seconds", "oauth.http.timeout.seconds"}


def test_jwks_url_alone_and_token_method() -> None:
    assert parse_validator_settings({"oauth.jwks.url": ISSUER + "/jwks"}).issuer_url is None
    token = parse_validator_settings({"oauth.validate.method": "token",
                                      "oauth.tenant.claim": "tenant"})
    assert (token.method, token.tenant_claim) == ("token", "tenant")


@pytest.mark.parametrize(("properties", "fragment"), [
    ({"oauth.issuer.url": ISSUER, "oauth.isuer.url": ISSUER}, "unknown OAuth key 'oauth.isuer"),
    ({"oauth.issuer.url": ISSUER, "tokenSecretKey": "x"}, "unknown OAuth key 'tokenSecretKey'"),
    ({"oauth.issuer.url": "ftp://x"}, "'oauth.issuer.url'"),
    ({"oauth.issuer.url": "not a url"}, "'oauth.issuer.url'"),
    ({"oauth.jwks.url": "file:///etc/keys"}, "'oauth.jwks.url'"),
    ({"oauth.issuer.url": ISSUER, "oauth.validate.method": "pulsar"},
     "'oauth.validate.method'"),
    ({"oauth.issuer.url": ISSUER, "oauth.algorithms": "HS256"}, "'HS256' is not allowed"),
    ({"oauth.issuer.url": ISSUER, "oauth.algorithms": "none"}, "'none' is not allowed"),
    ({"oauth.issuer.url": ISSUER, "oauth.algorithms": " , "}, "'oauth.algorithms'"),
    ({"oauth.issuer.url": ISSUER, "oauth.clock.skew.seconds": "-1"},
     "'oauth.clock.skew.seconds'"),
    ({"oauth.issuer.url": ISSUER, "oauth.clock.skew.seconds": "1.5"},
     "'oauth.clock.skew.seconds'"),
    ({"oauth.issuer.url": ISSUER, "oauth.jwks.refresh.min.seconds": "soon"},
     "'oauth.jwks.refresh.min.seconds'"),
    ({"oauth.issuer.url": ISSUER, "oauth.http.timeout.seconds": "0"},
     "'oauth.http.timeout.seconds'"),
    ({"oauth.issuer.url": ISSUER, "oauth.principal.claim": ""}, "'oauth.principal.claim'"),
    ({"oauth.issuer.url": ISSUER, "oauth.tenant.claim": "a b"}, "'oauth.tenant.claim'"),
    ({"oauth.issuer.url": ISSUER, "oauth.audience": ","}, "'oauth.audience'"),
    ({}, "'oauth.issuer.url' (or 'oauth.jwks.url') is required"),
    ({"oauth.validate.method": "token", "oauth.issuer.url": ISSUER},
     "'oauth.issuer.url' does not apply with oauth.validate.method=token"),
])
def test_refusals_name_the_key(properties: dict[str, str], fragment: str) -> None:
    with pytest.raises(OAuthConfigError) as info:
        parse_validator_settings(properties)
    assert fragment in str(info.value)


def test_reference_table_lists_every_key() -> None:
    table = settings_reference_markdown()
    for key in SETTING_KEYS:
        assert f"| `{key.name}` |" in table


# -- the broker and kopOauth2ConfigFile ---------------------------------------------------

def run_cli(tmp_path: Path, *settings: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "edge.cli", "--set", f"dataDir={tmp_path / 'data'}",
            "--set", "kafkaListeners=SASL_PLAINTEXT://127.0.0.1:0",
            "--set", "saslAllowedMechanisms=OAUTHBEARER"]
    for setting in settings:
        args += ["--set", setting]
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize(("text", "fragments"), [
    ("oauth.issuer.url=http://127.0.0.1:1\noauth.bogus=1\n", ("oauth.bogus",)),
    ("oauth.issuer.url=http://127.0.0.1:1\noauth.clock.skew.seconds=x\n",
     ("oauth.clock.skew.seconds",)),
    ("oauth.audience=kafka\n", ("oauth.issuer.url",)),
    ("oauth.validate.method=token\n", ("oauth.validate.method=token", "tokenSecretKey")),
])
def test_broker_refuses_a_bad_oauth_file(tmp_path: Path, text: str,
                                         fragments: tuple[str, ...]) -> None:
    path = tmp_path / "oauth.properties"
    path.write_text(text)
    refused_to_start(run_cli(tmp_path, f"kopOauth2ConfigFile={path}"), str(path), *fragments)


def test_broker_refuses_a_missing_oauth_file(tmp_path: Path) -> None:
    refused_to_start(run_cli(tmp_path, f"kopOauth2ConfigFile={tmp_path / 'nope.properties'}"),
                     "kopOauth2ConfigFile", "nope.properties")


def test_oauthbearer_without_any_validator_is_refused(tmp_path: Path) -> None:
    refused_to_start(run_cli(tmp_path), "OAUTHBEARER", "kopOauth2ConfigFile")


def test_validate_method_token_uses_the_plain_token_settings(tmp_path: Path) -> None:
    """``oauth.validate.method=token``: tokens signed with ``tokenSecretKey`` (KoP's way)."""
    secret = b"oauth-method-token-secret-oauth-method-token-secret"
    path = tmp_path / "oauth.properties"
    path.write_text("oauth.validate.method=token\noauth.tenant.claim=org\n")
    broker = start_broker(tmp_path, path,
                          tokenSecretKey="data:;base64," + base64.b64encode(secret).decode())
    try:
        token = jwt.encode({"sub": "bob", "org": "initech", "exp": int(time.time()) + 600},
                           secret, algorithm="HS256")
        assert good_login(broker.port, token).error_code == 0
        broker.wait_for_log(r"logged in as bob \(tenant initech\)")
        issuer = make_issuer()
        try:  # an issuer's RS256 token means nothing to this broker
            assert "not allowed" in rejected(broker.port, bearer_message(issuer_token(issuer)))
        finally:
            issuer.stop()
    finally:
        broker.stop()
