"""Security set-up from the broker config: which listeners need SASL or TLS, which SASL
mechanisms each offers, and the servers that check logins."""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from edge.config import BrokerConfig, ConfigError
from listeners.spec import ListenerSpec
from listeners.tls import TlsConfigError, TlsSettings, server_context
from oauth.token import JwtTokenValidator, TokenSettings
from sasl.oauthbearer import OAuthBearerServer
from sasl.plain import PlainServer
from sasl.types import SaslServer, TokenValidator

MECHANISMS = ("PLAIN", "OAUTHBEARER")
SaslFactory = Callable[[], SaslServer]


@dataclass(frozen=True, slots=True)
class ListenerSecurity:
    """What one listener demands of its clients."""

    name: str
    sasl: bool
    mechanisms: tuple[str, ...]
    tls: ssl.SSLContext | None


def _mechanism_list(text: str, where: str) -> tuple[str, ...]:
    names = tuple(m.strip() for m in text.replace("+", ",").split(",") if m.strip())
    for name in names:
        if name not in MECHANISMS:
            raise ConfigError(f"invalid value {text!r} for {where!r}: unknown SASL mechanism "
                              f"{name!r} (expected {', '.join(MECHANISMS)})")
    return names


def listener_mechanisms(config: BrokerConfig) -> dict[str, tuple[str, ...]]:
    """Per-listener SASL mechanisms: the override when given, else saslAllowedMechanisms."""
    default = _mechanism_list(config.sasl_allowed_mechanisms, "saslAllowedMechanisms")
    chosen = {spec.name: default for spec in config.listener_specs()}
    for entry in filter(None, (e.strip() for e in config.sasl_listener_mechanisms.split(","))):
        name, _, mechanisms = entry.partition(":")
        name = name.strip().upper()
        if name not in chosen or not mechanisms:
            raise ConfigError(f"invalid value {entry!r} for 'saslListenerMechanisms': expected "
                              f"NAME:MECH+MECH with NAME one of {', '.join(chosen)}")
        chosen[name] = _mechanism_list(mechanisms, "saslListenerMechanisms")
    return chosen


def token_validator(config: BrokerConfig) -> TokenValidator | None:
    """The validator of ``token:`` credentials, or None when no token key is configured."""
    if not config.token_secret_key and not config.token_public_key:
        return None
    try:
        return JwtTokenValidator(TokenSettings(
            secret_key=config.token_secret_key or None,
            public_key=config.token_public_key or None,
            auth_claim=config.token_auth_claim,
            audience_claim=config.token_audience_claim or None,
            audience=config.token_audience or None,
        ))
    except ValueError as exc:
        raise ConfigError(f"invalid token settings (tokenSecretKey/tokenPublicKey): {exc}") \
            from exc


def sasl_factories(config: BrokerConfig, validator: TokenValidator | None,
                   needed: set[str]) -> Mapping[str, SaslFactory]:
    """A server factory per mechanism some listener offers."""
    if needed and validator is None:
        raise ConfigError("SASL listeners need 'tokenSecretKey' or 'tokenPublicKey' to check "
                          "tokens")
    assert validator is not None or not needed
    factories: dict[str, SaslFactory] = {}
    if "PLAIN" in needed and validator is not None:
        plain_validator = validator
        factories["PLAIN"] = lambda: PlainServer(plain_validator)
    if "OAUTHBEARER" in needed and validator is not None:
        bearer_validator = validator
        factories["OAUTHBEARER"] = lambda: OAuthBearerServer(bearer_validator)
    return factories


def tls_context(config: BrokerConfig) -> ssl.SSLContext:
    """The server context shared by SSL and SASL_SSL listeners."""
    if not config.tls_certificate_file_path or not config.tls_key_file_path:
        raise ConfigError("SSL and SASL_SSL listeners need 'tlsCertificateFilePath' and "
                          "'tlsKeyFilePath'")
    try:
        return server_context(TlsSettings(
            config.tls_certificate_file_path, config.tls_key_file_path,
            config.tls_trust_certs_file_path,
            config.tls_require_trusted_client_cert_on_connect))
    except TlsConfigError as exc:
        raise ConfigError(str(exc)) from exc


def listener_security(config: BrokerConfig, spec: ListenerSpec,
                      mechanisms: Mapping[str, tuple[str, ...]],
                      context: Callable[[], ssl.SSLContext]) -> ListenerSecurity:
    """The security of one listener."""
    return ListenerSecurity(
        name=spec.name, sasl=spec.protocol.uses_sasl,
        mechanisms=mechanisms[spec.name] if spec.protocol.uses_sasl else (),
        tls=context() if spec.protocol.uses_tls else None,
    )
