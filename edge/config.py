"""Broker configuration: a Java properties file plus ``key=value`` overrides.

Every key is declared once, as a field of the pydantic model :class:`BrokerConfig`, in
the group of keys of its area (a model in :mod:`edge.config_keys` that ``BrokerConfig``
inherits)::

    max_queued_requests: Annotated[int, key(
        "maxQueuedRequests", "requests read ahead per connection", ge=1)] = 500

that is: the attribute (snake case of the property name), its Python type, then
:func:`common.settings.key` with the property name (KoP's camelCase, the field's
alias), its documentation and its constraints (``ge``/``le`` for integers,
``min_length=1`` for a required string), then the default.  The type says how the text
of a file or override is read (see :mod:`edge.config_types`): ``int``, ``bool``,
``str``, ``tuple[str, ...]`` for a comma-separated list (parsed at load), a ``Literal``
of upper-case words, :data:`Name`, :data:`StorageUrl` or :data:`CompressionType`.
:data:`CONFIG_KEYS` and :func:`config_reference_markdown` (the README's table, between
the ``config-table`` markers) are derived from the declarations, in the order of the
groups in ``BrokerConfig``'s bases and of the keys in each group; a check across keys goes
in :meth:`BrokerConfig._check_across_keys`.  A new area gets a group of its own (a
``BaseModel`` with the keys alone) added to the bases.

Porting a key declared the earlier way (``field(default=..., metadata=_key(name, type,
doc))``): ``IntType(a, b)`` becomes ``int`` with ``ge=a, le=b`` (``IntType(a)``: ``ge=a``
alone), ``BoolType()`` ``bool``, ``StrType()`` ``str`` (``allow_empty=False``:
``min_length=1``), ``NameType()`` :data:`Name`, ``StorageUrlType()`` :data:`StorageUrl`,
``ChoiceType(("A", "B"))`` ``Literal["A", "B"]``; a comma list read later by hand
becomes ``tuple[str, ...]``.

Values are stripped of surrounding whitespace before they are checked.  Unknown keys
and invalid values raise :class:`ConfigError` naming the key, the bad value (a password
in it masked) and what is expected, so that configuration mistakes stop start-up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Self

from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError, model_validator

from broker_core.topic_configs import topic_config_markdown
from common.settings import declared_keys, first_problem, to_text
from edge.config_keys.coordinators import CoordinatorKeys
from edge.config_keys.node import ConnectionKeys, NodeKeys
from edge.config_keys.operations import AuditKeys, LoggingKeys, MetricsKeys
from edge.config_keys.quotas import QuotaKeys
from edge.config_keys.security import AuthorizationKeys, ListenerSecurityKeys, SaslKeys
from edge.config_keys.storage import LogCleanerKeys, StorageKeys
from edge.config_types import ConfigError, ConfigKey, ConfigValue
from edge.properties import parse_properties
from listeners.connection_counts import parse_ip_overrides
from listeners.proxy_stage import TrustedProxies, parse_trusted_proxies
from listeners.spec import ListenerConfigError, ListenerSpec, parse_listeners

__all__ = [
    "CONFIG_KEYS",
    "TOPIC_DEFAULT_KEYS",
    "BrokerConfig",
    "ConfigError",
    "ConfigKey",
    "config_key_of",
    "config_reference_markdown",
    "load_config",
    "parse_properties",
    "topic_config_reference_markdown",
]

_LISTENER_KEYS = {
    "listeners": "kafkaListeners",
    "protocol_map": "kafkaProtocolMap",
    "advertised": "kafkaAdvertisedListeners",
}


# pydantic lays out the fields of the last base first: read the bases from the bottom up
# for the order of the keys (and of the README table).
class BrokerConfig(
    LoggingKeys,
    AuthorizationKeys,
    ListenerSecurityKeys,
    SaslKeys,
    MetricsKeys,
    QuotaKeys,
    AuditKeys,
    CoordinatorKeys,
    ConnectionKeys,
    LogCleanerKeys,
    StorageKeys,
    NodeKeys,
):
    """The validated broker configuration; construct it directly (by attribute or
    property name) or via :func:`load_config`.  Construction validates every field and
    the listener settings, raising ConfigError; the model is frozen."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True,
                              validate_by_name=True, validate_by_alias=True)

    _listener_specs: tuple[ListenerSpec, ...] = PrivateAttr(default=())
    _ip_overrides: dict[str, int] = PrivateAttr(default_factory=dict)
    _trusted_proxies: dict[str, TrustedProxies] = PrivateAttr(default_factory=dict)

    def __init__(self, **values: object) -> None:
        try:
            # pydantic's own __init__ (the groups of keys define none; mypy would read the
            # first group's typed one)
            BaseModel.__init__(self, **values)
        except ValidationError as exc:
            raise _config_error(exc) from None

    @model_validator(mode="after")
    def _check_across_keys(self) -> Self:
        if self.kafka_namespace == self.kafka_metadata_namespace:
            # a tenant's short names would live in <tenant>/<kafkaMetadataNamespace>, a
            # system namespace that only superusers may reach
            raise ConfigError(
                f"'kafkaNamespace' and 'kafkaMetadataNamespace' are both "
                f"{self.kafka_namespace!r}: short topic names would resolve into the system "
                f"namespace, where only superusers may go; give them different values")
        if self.broker_heartbeat_interval_ms * 2 > self.broker_session_timeout_ms:
            raise ConfigError(
                f"'brokerHeartbeatIntervalMs' ({self.broker_heartbeat_interval_ms}) must be at "
                f"most half of 'brokerSessionTimeoutMs' ({self.broker_session_timeout_ms}), or "
                "a live broker's lease may run out between two heartbeats")
        try:
            overrides = parse_ip_overrides(self.max_connections_per_ip_overrides)
        except ValueError as exc:
            shown = ",".join(self.max_connections_per_ip_overrides)
            raise ConfigError(f"invalid value {shown!r} for 'maxConnectionsPerIpOverrides': "
                              f"{exc}") from None
        if self.max_connections_per_ip == 0 and not overrides:
            raise ConfigError("'maxConnectionsPerIp' may be 0 only with "
                              "'maxConnectionsPerIpOverrides' (else no client may connect)")
        try:
            specs = parse_listeners(
                self.kafka_listeners, self.kafka_protocol_map, self.kafka_advertised_listeners
            )
        except ListenerConfigError as exc:
            name = _LISTENER_KEYS[exc.source]
            shown = getattr(self, CONFIG_KEYS[name].attr)
            raise ConfigError(f"invalid value {shown!r} for {name!r}: {exc}") from None
        self._listener_specs = tuple(specs)
        self._ip_overrides = overrides
        self._trusted_proxies = self._read_trusted_proxies(specs)
        return self

    def _read_trusted_proxies(self, specs: Sequence[ListenerSpec]) -> dict[str, TrustedProxies]:
        """``proxyProtocolTrustedAddresses`` read, each name one of the listeners."""
        shown = ",".join(self.proxy_protocol_trusted_addresses)
        try:
            trusted = parse_trusted_proxies(self.proxy_protocol_trusted_addresses)
        except ValueError as exc:
            raise ConfigError(f"invalid value {shown!r} for 'proxyProtocolTrustedAddresses': "
                              f"{exc}") from None
        names = [spec.name for spec in specs]
        for name in trusted:
            if name not in names:
                raise ConfigError(
                    f"invalid value {shown!r} for 'proxyProtocolTrustedAddresses': no "
                    f"listener named {name!r} (there are {', '.join(names)})")
        return trusted

    @property
    def explicit_keys(self) -> frozenset[str]:
        """The keys the file or an override named (or the constructor was given), so
        start-up can tell a value the operator chose from a default."""
        return frozenset(_BY_ATTR[attr].name for attr in self.model_fields_set)

    def replace(self, **changes: object) -> BrokerConfig:
        """A copy with ``changes`` (by attribute name), validated again."""
        kept: dict[str, object] = {attr: getattr(self, attr) for attr in self.model_fields_set}
        return BrokerConfig(**(kept | changes))

    def effective_storage_url(self) -> str:
        """``storageUrl``, or the file URL of ``dataDir`` made absolute when it is empty."""
        return self.storage_url or Path(self.data_dir).resolve().as_uri()

    def listener_specs(self) -> list[ListenerSpec]:
        """The parsed listeners, in the order configured."""
        return list(self._listener_specs)

    def ip_overrides(self) -> dict[str, int]:
        """``maxConnectionsPerIpOverrides`` read: address -> its cap."""
        return dict(self._ip_overrides)

    def trusted_proxies(self) -> dict[str, TrustedProxies]:
        """``proxyProtocolTrustedAddresses`` read: listener name -> where its PROXY
        protocol headers may come from (listeners without a header are not in it)."""
        return dict(self._trusted_proxies)

    def to_properties(self) -> dict[str, str]:
        """Every key as properties text (``load_config`` of these gives an equal config)."""
        return {key.name: to_text(getattr(self, key.attr)) for key in CONFIG_KEYS.values()}

    def shown_properties(self) -> dict[str, str]:
        """Every key as properties text with secrets masked (a password in ``storageUrl``,
        the key in a ``data:`` ``tokenSecretKey``), for an operator to read."""
        return {key.name: key.shown(to_text(getattr(self, key.attr)))
                for key in CONFIG_KEYS.values()}


CONFIG_KEYS: Mapping[str, ConfigKey] = MappingProxyType({
    declared.name: ConfigKey(declared.name, declared.attr, declared.info)
    for declared in declared_keys(BrokerConfig)
})
"""Every configuration key by property name, in declaration order."""

_BY_ATTR: Mapping[str, ConfigKey] = {key.attr: key for key in CONFIG_KEYS.values()}


def config_key_of(attr: str) -> ConfigKey:
    """The key whose value :class:`BrokerConfig` holds in field ``attr``."""
    return _BY_ATTR[attr]

TOPIC_DEFAULT_KEYS: Mapping[str, str] = MappingProxyType({
    "retention.ms": "log_retention_ms",
    "retention.bytes": "log_retention_bytes",
    "segment.bytes": "log_segment_bytes",
    "segment.ms": "log_segment_ms",
    "compression.type": "compression_type",
    "flush.messages": "flush_interval_messages",
    "flush.ms": "flush_interval_ms",
})
"""Topic configs whose default a broker config key sets: topic key -> the key's field."""


def _config_error(exc: ValidationError) -> ConfigError:
    """The ConfigError for the first problem pydantic found."""
    problem = first_problem(exc)
    if isinstance(problem.cause, ConfigError):
        return problem.cause
    found = CONFIG_KEYS.get(problem.where) or _BY_ATTR.get(problem.where)
    if found is None:
        return ConfigError(f"unknown config key {problem.where!r}")
    return found.invalid(problem.value)


# ----------------------------------------------------------------------------- loading


def _apply(values: dict[str, ConfigValue], name: str, text: str) -> None:
    """Parse ``text`` into ``values`` for key ``name``."""
    found = CONFIG_KEYS.get(name)
    if found is None:
        raise ConfigError(f"unknown config key {name!r}")
    values[found.attr] = found.parse(text)


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> BrokerConfig:
    """Read ``path`` (if given), apply ``key=value`` overrides in order, and validate.

    Raises ConfigError for an unreadable file, a malformed override, an unknown key or
    an invalid value; the message names the file, override or key at fault.
    """
    values: dict[str, ConfigValue] = {}
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config file {str(path)!r}: {exc}") from None
        try:
            for name, value in parse_properties(text).items():
                _apply(values, name, value)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    for override in overrides:
        name, sep, value = override.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"malformed override {override!r}: expected key=value")
        _apply(values, name.strip(), value)
    return BrokerConfig(**values)


def config_reference_markdown() -> str:
    """A Markdown table of every key: name, type, default and meaning."""
    rows = [
        "| key | value | default | meaning |",
        "|---|---|---|---|",
    ]
    for item in CONFIG_KEYS.values():
        default = to_text(item.default)
        shown = f"`{default}`" if default else '`""`'
        rows.append(f"| `{item.name}` | {item.expected()} | {shown} | {item.doc} |")
    return "\n".join(rows) + "\n"


def topic_config_reference_markdown() -> str:
    """The README's topic config table (:func:`broker_core.topic_configs.topic_config_markdown`),
    the default of a key that a broker key sets (:data:`TOPIC_DEFAULT_KEYS`) naming that
    key and its default."""
    defaults = {}
    for topic_key, attr in TOPIC_DEFAULT_KEYS.items():
        broker_key = _BY_ATTR[attr]
        defaults[topic_key] = (f"the broker's `{broker_key.name}` "
                               f"(`{to_text(broker_key.default)}` by default)")
    return topic_config_markdown(defaults)
