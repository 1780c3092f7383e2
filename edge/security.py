"""Security set-up from the broker config: which listeners need SASL or TLS, which SASL
mechanisms each offers, and the servers that check logins.

OAUTHBEARER checks tokens with the validator that ``kopOauth2ConfigFile`` describes
(``oauth.*`` keys, see ``oauth.settings``): the issuer's JWKS by default, or the PLAIN
token settings with ``oauth.validate.method=token``. Without that file it uses the PLAIN
token settings, as KoP did."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from edge.config import BrokerConfig, ConfigError, parse_properties
from listeners.spec import ListenerSpec
from listeners.tls import PrincipalMode, TlsConfigError, TlsSettings, server_context
from listeners.tls_source import TlsContextSource
from oauth.errors import OAuthConfigError
from oauth.jwks_validator import JwksTokenValidator
from oauth.key_validator import JwtTokenValidator, TokenSettings
from oauth.settings import METHOD_TOKEN, ValidatorSettings, parse_validator_settings
from sasl.oauthbearer import OAuthBearerServer
from sasl.plain import PlainServer
from sasl.token_cache import CachedTokenValidator
from sasl.types import Authenticated, SaslServer, TokenValidator

MECHANISMS = ("PLAIN", "OAUTHBEARER")
"""The SASL mechanisms a listener may enable."""
SaslFactory = Callable[[], SaslServer]
log = logging.getLogger(__name__)

ALLOW_TOKENS_WITHOUT_EXP = "tokenExpiration=OPTIONAL accepts tokens without one"
"""What a refusal of a token without ``exp`` tells the client and the log."""


@dataclass(frozen=True, slots=True)
class ListenerSecurity:
    """What one listener demands of its clients."""

    name: str
    sasl: bool
    mechanisms: tuple[str, ...]
    tls: Callable[[], ssl.SSLContext] | None
    """The server context for a connection accepted now (None: no TLS)."""
    tls_principal: PrincipalMode = "CN"
    """What names the principal of a client certificate (``tlsPrincipal``)."""


def _mechanism_list(names: tuple[str, ...], text: str, where: str) -> tuple[str, ...]:
    for name in names:
        if name not in MECHANISMS:
            raise ConfigError(f"invalid value {text!r} for {where!r}: unknown SASL mechanism "
                              f"{name!r} (expected {', '.join(MECHANISMS)})")
    return names


def listener_mechanisms(config: BrokerConfig) -> dict[str, tuple[str, ...]]:
    """Per-listener SASL mechanisms: the override when given, else saslAllowedMechanisms."""
    allowed = config.sasl_allowed_mechanisms
    default = _mechanism_list(allowed, ",".join(allowed), "saslAllowedMechanisms")
    chosen = {spec.name: default for spec in config.listener_specs()}
    for entry in config.sasl_listener_mechanisms:
        name, _, mechanisms = entry.partition(":")
        name = name.strip().upper()
        if name not in chosen or not mechanisms:
            raise ConfigError(f"invalid value {entry!r} for 'saslListenerMechanisms': expected "
                              f"NAME:MECH+MECH with NAME one of {', '.join(chosen)}")
        names = tuple(m.strip() for m in mechanisms.split("+") if m.strip())
        chosen[name] = _mechanism_list(names, mechanisms, "saslListenerMechanisms")
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
            require_exp=config.token_expiration == "REQUIRED",
            max_lifetime_seconds=config.token_max_lifetime_seconds,
            missing_exp_hint=ALLOW_TOKENS_WITHOUT_EXP,
        ))
    except ValueError as exc:
        raise ConfigError(f"invalid token settings (tokenSecretKey/tokenPublicKey): {exc}") \
            from exc


def token_expiration_notice(config: BrokerConfig,
                            validator: TokenValidator | None) -> str | None:
    """The start-up note for an operator who left ``tokenExpiration`` at its default
    (``REQUIRED``) while token logins are configured (``validator``, from
    :func:`token_validator`, checks PLAIN's tokens and OAUTHBEARER's without an issuer):
    deployments upgraded from before the key may hold tokens without ``exp``, which are
    now refused. None when the key was set, or without a token key (OAUTHBEARER with the
    issuer's JWKS requires ``exp`` whatever the key says)."""
    if "tokenExpiration" in config.explicit_keys or validator is None:
        return None
    return ("token logins refuse tokens without an 'exp' claim (tokenExpiration=REQUIRED, "
            "the default); set tokenExpiration=OPTIONAL to accept them, as before the key "
            "existed, or tokenExpiration=REQUIRED to silence this note")


def oauth_settings(config: BrokerConfig) -> ValidatorSettings | None:
    """The settings in ``kopOauth2ConfigFile``, or None when no file is configured."""
    path = config.kop_oauth2_config_file
    if not path:
        return None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read 'kopOauth2ConfigFile' {path!r}: {exc}") from None
    try:
        return parse_validator_settings(parse_properties(text))
    except (OAuthConfigError, ConfigError) as exc:
        raise ConfigError(f"{path} (kopOauth2ConfigFile): {exc}") from None


@dataclass(frozen=True, slots=True)
class BearerSetup:
    """How OAUTHBEARER logins are checked."""

    validator: TokenValidator
    tenant_claim: str | None


def bearer_setup(config: BrokerConfig, token: TokenValidator | None) -> BearerSetup | None:
    """The OAUTHBEARER validator: from ``kopOauth2ConfigFile``, else the PLAIN token one."""
    settings = oauth_settings(config)
    if settings is None:
        return BearerSetup(token, None) if token is not None else None
    if settings.method == METHOD_TOKEN:
        if token is None:
            raise ConfigError(f"{config.kop_oauth2_config_file} (kopOauth2ConfigFile): "
                              "oauth.validate.method=token needs 'tokenSecretKey' or "
                              "'tokenPublicKey'")
        return BearerSetup(token, settings.tenant_claim)
    lifetime = settings.model_copy(
        update={"max_lifetime_seconds": config.token_max_lifetime_seconds})
    return BearerSetup(JwksTokenValidator(lifetime), settings.tenant_claim)


class LoggedBearerServer:
    """An OAUTHBEARER server that logs each accepted login with its extensions."""

    def __init__(self, inner: OAuthBearerServer) -> None:
        self._inner = inner
        self.mechanism = inner.mechanism

    @property
    def complete(self) -> bool:
        return self._inner.complete

    @property
    def result(self) -> Authenticated | None:
        return self._inner.result

    @property
    def refused(self) -> str | None:
        return self._inner.refused

    @property
    def claimed_tenant(self) -> str | None:
        return self._inner.claimed_tenant

    def step(self, message: bytes) -> bytes:
        challenge = self._inner.step(message)
        result = self._inner.result
        if result is not None:
            extensions = ", ".join(f"{k}={v}" for k, v in sorted(result.extensions.items()))
            log.info("OAUTHBEARER token accepted: principal %s, tenant %s, extensions [%s]",
                     result.principal, result.tenant or "(default)", extensions)
        return challenge


def _checked_bearer(config: BrokerConfig, validator: TokenValidator | None,
                    needed: set[str]) -> BearerSetup | None:
    """The OAUTHBEARER set-up; ConfigError when a ``needed`` mechanism has no validator."""
    bearer = bearer_setup(config, validator)
    if "PLAIN" in needed and validator is None:
        raise ConfigError("SASL listeners need 'tokenSecretKey' or 'tokenPublicKey' to check "
                          "tokens")
    if "OAUTHBEARER" in needed and bearer is None:
        raise ConfigError("OAUTHBEARER needs 'kopOauth2ConfigFile' (or 'tokenSecretKey' / "
                          "'tokenPublicKey') to check tokens")
    return bearer


def check_security(config: BrokerConfig) -> None:
    """Everything start-up checks of the security settings, without serving or fetching
    anything: the mechanisms per listener, the TLS files of TLS listeners, the token keys
    and the OAUTHBEARER settings. ConfigError names the first problem."""
    mechanisms = listener_mechanisms(config)
    specs = config.listener_specs()
    for sasl in tls_kinds(config):
        tls_context(config, sasl)
    needed = {m for spec in specs if spec.protocol.uses_sasl for m in mechanisms[spec.name]}
    _checked_bearer(config, token_validator(config), needed)


def sasl_factories(config: BrokerConfig, validator: TokenValidator | None,
                   needed: set[str]) -> Mapping[str, SaslFactory]:
    """A server factory per mechanism some listener offers (``validator`` checks PLAIN's
    ``token:`` passwords). ``oauth.tenant.claim`` binds the tokens of both mechanisms to
    their tenant."""
    bearer = _checked_bearer(config, validator, needed)
    factories: dict[str, SaslFactory] = {}
    tenant_claim = bearer.tenant_claim if bearer is not None else None
    if "PLAIN" in needed and validator is not None:
        plain_validator = CachedTokenValidator(validator)
        reserved = config.kafka_metadata_namespace
        factories["PLAIN"] = lambda: PlainServer(plain_validator, reserved_namespace=reserved,
                                                 tenant_claim=tenant_claim)
    if "OAUTHBEARER" in needed and bearer is not None:
        setup = bearer
        if isinstance(setup.validator, JwksTokenValidator):
            setup.validator.warm_up()
        bearer_validator = CachedTokenValidator(setup.validator)
        factories["OAUTHBEARER"] = lambda: LoggedBearerServer(
            OAuthBearerServer(bearer_validator, tenant_claim=setup.tenant_claim))
    return factories


def tls_context(config: BrokerConfig, sasl: bool) -> ssl.SSLContext:
    """The server context of the SSL listeners (``sasl`` False: they ask for client
    certificates, as ``tlsTrustCertsFilePath`` and ``tlsRequireTrustedClientCertOnConnect``
    say) or of the SASL_SSL ones (True: they ask for none, their clients log in by SASL;
    Kafka's ``ssl.client.auth`` is for SSL listeners too, KIP-684)."""
    if not config.tls_certificate_file_path or not config.tls_key_file_path:
        raise ConfigError("SSL and SASL_SSL listeners need 'tlsCertificateFilePath' and "
                          "'tlsKeyFilePath'")
    try:
        return server_context(TlsSettings(
            config.tls_certificate_file_path, config.tls_key_file_path,
            config.tls_trust_certs_file_path,
            config.tls_require_trusted_client_cert_on_connect, client_certs=not sasl))
    except TlsConfigError as exc:
        raise ConfigError(str(exc)) from exc


TlsContexts = dict[bool, ssl.SSLContext]
"""The server contexts of the TLS listeners by kind (:func:`tls_context`'s ``sasl``)."""


def tls_kinds(config: BrokerConfig) -> list[bool]:
    """The kinds of TLS listener ``config`` has (:func:`tls_context`'s ``sasl``)."""
    return sorted({spec.protocol.uses_sasl for spec in config.listener_specs()
                   if spec.protocol.uses_tls})


def tls_source(config: BrokerConfig) -> TlsContextSource[TlsContexts] | None:
    """The server contexts of the kinds of TLS listener ``config`` has (None: it has none),
    built from its TLS files, and again for new connections when those files change or on
    SIGHUP: both kinds at once, so that files that fail say so in one line. ConfigError
    when they cannot be built at start-up."""
    kinds = tls_kinds(config)
    if not kinds:
        return None

    def build() -> TlsContexts:
        return {sasl: tls_context(config, sasl) for sasl in kinds}

    return TlsContextSource(
        " and ".join("the SASL_SSL listeners" if sasl else "the SSL listeners"
                     for sasl in kinds), build,
        (config.tls_certificate_file_path, config.tls_key_file_path,
         config.tls_trust_certs_file_path))


def listener_security(config: BrokerConfig, spec: ListenerSpec,
                      mechanisms: Mapping[str, tuple[str, ...]],
                      source: TlsContextSource[TlsContexts] | None) -> ListenerSecurity:
    """The security of one listener (``source``: :func:`tls_source`, which a TLS listener
    takes its kind's context from)."""
    sasl = spec.protocol.uses_sasl
    tls = None
    if spec.protocol.uses_tls:
        assert source is not None, "tls_source has a context for every TLS listener"
        tls = partial(_context_of, source, sasl)
    return ListenerSecurity(
        name=spec.name, sasl=sasl, mechanisms=mechanisms[spec.name] if sasl else (),
        tls=tls, tls_principal=config.tls_principal)


def _context_of(source: TlsContextSource[TlsContexts], sasl: bool) -> ssl.SSLContext:
    return source.current()[sasl]
