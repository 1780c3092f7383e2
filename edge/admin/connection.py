"""Where and how the admin command connects: ``--bootstrap-server`` and a Kafka client
properties file (``--command-config``, as Kafka's tools take it).

The file holds librdkafka / Java client keys: ``bootstrap.servers``, ``security.protocol``,
``sasl.mechanism``, ``sasl.username``, ``sasl.password``, ``ssl.ca.location``,
``ssl.certificate.location``, ``ssl.key.location``, ``ssl.key.password``,
``ssl.endpoint.identification.algorithm`` and ``client.id``; they become kafka-python's
settings. The Java client's store keys are taken for PEM stores (``ssl.truststore.type=PEM``
with ``ssl.truststore.location``; ``ssl.keystore.type=PEM`` with ``ssl.keystore.location``,
a file holding the certificate and its key); a JKS or PKCS12 store is a usage error saying
so. ``sasl.mechanism=OAUTHBEARER`` logs in with OIDC client credentials, from the
``sasl.oauthbearer.*`` keys (``edge.admin.bearer``). ``sasl.jaas.config`` with Kafka's
``PlainLoginModule`` gives the PLAIN username and password (``edge.admin.jaas``). An
unknown key is a usage error naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kafka import KafkaAdminClient

from edge.admin.bearer import BEARER_KEYS, first_token, token_provider
from edge.admin.errors import UsageError
from edge.admin.jaas import KEY as JAAS_KEY
from edge.admin.jaas import plain_login
from edge.config import ConfigError, parse_properties
from oauth.kafka_python_provider import KafkaPythonTokenProvider

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"

_KEYWORDS: Mapping[str, str] = {
    "bootstrap.servers": "bootstrap_servers",
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "ssl.truststore.location": "ssl_cafile",
    "ssl.keystore.location": "ssl_certfile",
    "client.id": "client_id",
}
"""Client property -> kafka-python keyword, for the keys taken as they are."""

_STORE_TYPES = {"ssl.truststore.location": "ssl.truststore.type",
                "ssl.keystore.location": "ssl.keystore.type"}
"""A Java store's location key -> the key of its type (Java's default type is JKS)."""
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "OAUTHBEARER")


@dataclass(frozen=True)
class ClientSettings:
    """kafka-python keyword settings shared by the admin client, producer and consumer."""

    bootstrap: str
    options: dict[str, str | bool] = field(default_factory=dict)
    timeout_ms: int = 30000
    token_provider: KafkaPythonTokenProvider | None = None
    """The OAUTHBEARER login, when ``sasl.mechanism`` is OAUTHBEARER."""

    def keywords(self) -> dict[str, object]:
        """The keyword arguments of a kafka-python client (with OAUTHBEARER, once a first
        token was had: CallFailed with the issuer's refusal)."""
        login: dict[str, object] = {}
        if self.token_provider is not None:
            first_token(self.token_provider)
            login["sasl_oauth_token_provider"] = self.token_provider
        return {"bootstrap_servers": self.bootstrap.split(","), **self.options, **login,
                "request_timeout_ms": self.timeout_ms,
                "client_id": self.options.get("client_id", "edge-broker-admin")}

    def admin_keywords(self) -> dict[str, object]:
        """The keyword arguments of a kafka-python admin client (how long it may look
        for a broker included)."""
        return {**self.keywords(), "bootstrap_timeout_ms": self.timeout_ms}


def _read_file(path: str) -> dict[str, str]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read --command-config {path!r}: {exc}") from None
    try:
        return parse_properties(text)
    except ConfigError as exc:
        raise UsageError(f"{path}: {exc}") from None


def _option(key: str, value: str, where: str) -> tuple[str, str | bool]:
    if key == "security.protocol":
        value = value.upper()
        if value not in _PROTOCOLS:
            raise UsageError(f"{where}: security.protocol {value!r} is not one of "
                             f"{', '.join(_PROTOCOLS)}")
    elif key in ("sasl.mechanism", "sasl.mechanisms"):
        value = value.upper()
        if value not in _MECHANISMS:
            raise UsageError(f"{where}: sasl.mechanism {value!r} is not supported here "
                             f"(supported: {', '.join(_MECHANISMS)})")
    elif key == "ssl.endpoint.identification.algorithm":
        return "ssl_check_hostname", value.lower() not in ("", "none")
    keyword = _KEYWORDS.get(key)
    if keyword is None:
        supported = [*_KEYWORDS, "ssl.endpoint.identification.algorithm", JAAS_KEY,
                     *BEARER_KEYS]
        raise UsageError(f"{where}: unsupported client property {key!r} (supported: "
                         f"{', '.join(supported)})")
    return keyword, value


def _check_stores(properties: dict[str, str], where: str) -> None:
    """Java store keys name PEM stores (their type keys are then dropped); else UsageError."""
    for location, type_key in _STORE_TYPES.items():
        kind = properties.pop(type_key, None)
        if location not in properties:
            continue
        if (kind or "JKS").upper() != "PEM":
            raise UsageError(f"{where}: {location} is read as a PEM file only: set {type_key}"
                             f"=PEM (a {kind or 'JKS'} store is not read; convert it with "
                             "openssl or keytool)")


def _take_jaas(properties: dict[str, str], where: str) -> None:
    """``sasl.jaas.config`` (the PLAIN login module) as ``sasl.username`` and
    ``sasl.password``, PLAIN the mechanism unless another is set (UsageError then)."""
    text = properties.pop(JAAS_KEY, None)
    if text is None:
        return
    both = [key for key in ("sasl.username", "sasl.password") if key in properties]
    if both:
        raise UsageError(f"{where}: {JAAS_KEY} and {', '.join(both)} both give the login: "
                         "keep one")
    try:
        username, password = plain_login(text)
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from None
    mechanism = properties.setdefault("sasl.mechanism",
                                      properties.get("sasl.mechanisms", "PLAIN"))
    if mechanism.upper() != "PLAIN":
        raise UsageError(f"{where}: {JAAS_KEY} holds a PLAIN login, but sasl.mechanism is "
                         f"{mechanism!r}")
    properties["sasl.username"], properties["sasl.password"] = username, password


def client_settings(bootstrap: str | None, command_config: str | None,
                    timeout_s: float) -> ClientSettings:
    """The settings from the flags and the properties file (the flag wins)."""
    properties = _read_file(command_config) if command_config else {}
    where = command_config or ""
    _check_stores(properties, where)
    _take_jaas(properties, where)
    bearer = {key: value for key, value in properties.items() if key in BEARER_KEYS}
    options: dict[str, str | bool] = {}
    for key, value in properties.items():
        if key not in BEARER_KEYS:
            name, typed = _option(key, value, where)
            options[name] = typed
    if timeout_s <= 0:
        raise UsageError("--timeout must be positive")
    provider = None
    if options.get("sasl_mechanism") == "OAUTHBEARER":
        provider = token_provider(bearer, where, timeout_s)
    elif bearer:
        raise UsageError(f"{where}: {', '.join(bearer)} need sasl.mechanism=OAUTHBEARER")
    address = bootstrap or str(options.pop("bootstrap_servers", "")) or DEFAULT_BOOTSTRAP
    options.pop("bootstrap_servers", None)
    return ClientSettings(address, options, int(timeout_s * 1000), provider)


class Clients:
    """The kafka-python clients of one command, made when first needed and closed at
    the end."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self._admin: KafkaAdminClient | None = None

    def admin(self) -> KafkaAdminClient:
        """The admin client (connected on first use)."""
        if self._admin is None:
            self._admin = KafkaAdminClient(**self.settings.admin_keywords())
        return self._admin

    def close(self) -> None:
        """Close what was opened."""
        if self._admin is not None:
            self._admin.close()
            self._admin = None
