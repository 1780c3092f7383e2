"""KIP-368 session lifetime and the SASL mechanism registry."""

from __future__ import annotations

import base64

import pytest

from oauth import JwtTokenValidator, TokenSettings
from sasl import (
    OAuthBearerServer,
    PlainServer,
    SaslMechanismRegistry,
    UnsupportedMechanism,
    make_server,
    session_lifetime_ms,
)


@pytest.mark.parametrize(
    ("now", "expiry", "max_reauth", "expected"),
    [
        (1_000, None, 0, 0),
        (1_000, None, -5, 0),
        (1_000, None, 60_000, 60_000),
        (1_000, 31_000, 0, 30_000),
        (1_000, 31_000, 60_000, 30_000),
        (1_000, 301_000, 60_000, 60_000),
        (1_000, 1_000, 60_000, 1),
        (1_000, 500, 0, 1),
        (1_000, 500, 60_000, 1),
    ],
)
def test_session_lifetime(now: int, expiry: int | None, max_reauth: int, expected: int) -> None:
    assert session_lifetime_ms(now, expiry, max_reauth) == expected


@pytest.fixture
def validator() -> JwtTokenValidator:
    url = f"data:;base64,{base64.b64encode(b's' * 32).decode()}"
    return JwtTokenValidator(TokenSettings(secret_key=url))


def test_registry_builds_fresh_servers(validator: JwtTokenValidator) -> None:
    registry = SaslMechanismRegistry(
        ["PLAIN", "OAUTHBEARER"], plain_validator=validator, oauthbearer_validator=validator
    )
    assert registry.enabled == ("PLAIN", "OAUTHBEARER")
    first = registry.make_server("PLAIN")
    assert isinstance(first, PlainServer)
    assert registry.make_server("PLAIN") is not first
    assert isinstance(registry.make_server("OAUTHBEARER"), OAuthBearerServer)


def test_registry_rejects_disabled_mechanism(validator: JwtTokenValidator) -> None:
    registry = SaslMechanismRegistry(["PLAIN"], plain_validator=validator)
    for name in ("OAUTHBEARER", "plain", "SCRAM-SHA-256", ""):
        with pytest.raises(UnsupportedMechanism) as info:
            registry.make_server(name)
        assert info.value.allowed == ("PLAIN",)
        assert info.value.mechanism == name
        assert "enabled mechanisms: PLAIN" in info.value.message


def test_registry_configuration_errors(validator: JwtTokenValidator) -> None:
    with pytest.raises(ValueError, match="PLAIN is enabled but has no token validator"):
        SaslMechanismRegistry(["PLAIN"])
    with pytest.raises(ValueError, match="OAUTHBEARER is enabled"):
        SaslMechanismRegistry(["OAUTHBEARER"], plain_validator=validator)
    with pytest.raises(ValueError, match="unknown SASL mechanism 'GSSAPI'"):
        SaslMechanismRegistry(["GSSAPI"], plain_validator=validator)


def test_make_server_function(validator: JwtTokenValidator) -> None:
    server = make_server("OAUTHBEARER", ["PLAIN", "OAUTHBEARER"], oauthbearer_validator=validator)
    assert server.mechanism == "OAUTHBEARER"
    with pytest.raises(UnsupportedMechanism) as info:
        make_server("GSSAPI", ["PLAIN", "OAUTHBEARER"], plain_validator=validator)
    assert info.value.allowed == ("PLAIN", "OAUTHBEARER")
    assert "GSSAPI" in str(info.value) and "PLAIN, OAUTHBEARER" in str(info.value)
