"""Broker configuration: a Java properties file plus ``key=value`` overrides.

This module owns the configuration keys of the broker, their defaults and validation,
and the Java ``.properties`` parser they are read with.  Every key is declared once, as
a field of :class:`BrokerConfig` carrying a :class:`ConfigKey` in its metadata (property
name, value type with its constraints, documentation); :data:`CONFIG_KEYS` and
:func:`config_reference_markdown` are derived from those declarations.

Values are stripped of surrounding whitespace before they are checked.  Unknown keys
and invalid values raise :class:`ConfigError` naming the key, the bad value and what
is expected, so that configuration mistakes stop start-up.
"""

from __future__ import annotations

import dataclasses
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from broker_core.storage.engines import ENGINES, shown_url, storage_scheme
from common.names import NAME_RULE, is_valid_name
from listeners.spec import ListenerConfigError, ListenerSpec, parse_listeners

__all__ = [
    "CONFIG_KEYS",
    "BoolType",
    "BrokerConfig",
    "ChoiceType",
    "ConfigError",
    "ConfigKey",
    "IntType",
    "NameType",
    "StrType",
    "ValueType",
    "config_reference_markdown",
    "load_config",
    "parse_properties",
]

LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration file, key or value is wrong; the message says which and why."""


# --------------------------------------------------------------------------- properties


_WHITESPACE = " \t\f"
_SIMPLE_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_HEX4 = re.compile(r"[0-9A-Fa-f]{4}")


def _ends_with_continuation(line: str) -> bool:
    """True if ``line`` ends in an odd number of backslashes."""
    count = len(line) - len(line.rstrip("\\"))
    return count % 2 == 1


def _unescape(text: str, line_no: int) -> str:
    """Resolve Java properties escapes: ``\\t \\n \\r \\f \\uXXXX`` and ``\\<char>``."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "\\":
            out.append(char)
            i += 1
            continue
        if i + 1 >= len(text):  # a lone trailing backslash means nothing
            break
        code = text[i + 1]
        if code == "u":
            digits = text[i + 2 : i + 6]
            if not _HEX4.fullmatch(digits):
                raise ConfigError(f"line {line_no}: malformed \\uXXXX escape {text[i:i + 6]!r}")
            out.append(chr(int(digits, 16)))
            i += 6
        else:
            out.append(_SIMPLE_ESCAPES.get(code, code))
            i += 2
    return "".join(out)


def _split_key_value(line: str) -> tuple[str, str]:
    """Split a logical line (escapes unresolved) at its first unescaped separator.

    The key ends at the first unescaped ``=``, ``:`` or whitespace; whitespace, at most
    one ``=`` or ``:``, and more whitespace then separate it from the value.
    """
    i = 0
    while i < len(line):
        char = line[i]
        if char == "\\":
            i += 2
            continue
        if char in "=:" or char in _WHITESPACE:
            break
        i += 1
    key = line[:i]
    rest = line[i:].lstrip(_WHITESPACE)
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(_WHITESPACE)
    return key, rest


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java ``.properties`` text into a dict (a repeated key: the last one wins).

    Supports ``key=value``, ``key:value`` and ``key value``; ``#`` and ``!`` comment
    lines; blank lines; leading whitespace; backslash line continuation (leading
    whitespace of the continued line is dropped); escapes ``\\t \\n \\r \\f \\\\ \\=
    \\: \\uXXXX`` and backslash before any other character.
    """
    result: dict[str, str] = {}
    lines = _LINE_BREAK.split(text)
    index = 0
    while index < len(lines):
        line_no = index + 1
        logical = lines[index].lstrip(_WHITESPACE)
        index += 1
        if not logical or logical[0] in "#!":
            continue
        while _ends_with_continuation(logical):
            logical = logical[:-1]
            if index >= len(lines):
                break
            logical += lines[index].lstrip(_WHITESPACE)
            index += 1
        raw_key, raw_value = _split_key_value(logical)
        result[_unescape(raw_key, line_no)] = _unescape(raw_value, line_no)
    return result


# ------------------------------------------------------------------------- value types


class ValueType(ABC, Generic[T]):
    """How one key's value is parsed from text, checked, and written back as text."""

    @abstractmethod
    def parse(self, text: str) -> T:
        """The value ``text`` denotes; raises ValueError if it is not acceptable."""

    @abstractmethod
    def check(self, value: object) -> bool:
        """Whether an already-typed ``value`` is acceptable."""

    def shown(self, text: str) -> str:
        """``text`` as an error message may show it (a secret inside is masked)."""
        return text

    @abstractmethod
    def expected(self) -> str:
        """What an acceptable value looks like, for error messages and docs."""

    def format(self, value: T) -> str:
        """``value`` as properties text, such that ``parse(format(v)) == v``."""
        return str(value)


@dataclass(frozen=True)
class IntType(ValueType[int]):
    """A decimal integer within ``[minimum, maximum]``."""

    minimum: int
    maximum: int = LONG_MAX

    _SYNTAX = re.compile(r"[+-]?[0-9]+")

    def parse(self, text: str) -> int:
        if not self._SYNTAX.fullmatch(text):
            raise ValueError(text)
        value = int(text)
        if not self.check(value):
            raise ValueError(text)
        return value

    def check(self, value: object) -> bool:
        return type(value) is int and self.minimum <= value <= self.maximum

    def expected(self) -> str:
        if self.maximum == LONG_MAX:
            return f"an integer >= {self.minimum}"
        return f"an integer >= {self.minimum} and <= {self.maximum}"


@dataclass(frozen=True)
class BoolType(ValueType[bool]):
    """``true`` or ``false``, in any case."""

    def parse(self, text: str) -> bool:
        lowered = text.lower()
        if lowered not in ("true", "false"):
            raise ValueError(text)
        return lowered == "true"

    def check(self, value: object) -> bool:
        return isinstance(value, bool)

    def expected(self) -> str:
        return "true or false"

    def format(self, value: bool) -> str:
        return "true" if value else "false"


@dataclass(frozen=True)
class StrType(ValueType[str]):
    """Any text, optionally required to be non-empty."""

    allow_empty: bool = True

    def parse(self, text: str) -> str:
        if not self.check(text):
            raise ValueError(text)
        return text

    def check(self, value: object) -> bool:
        return isinstance(value, str) and (self.allow_empty or value != "")

    def expected(self) -> str:
        return "a string" if self.allow_empty else "a non-empty string"


@dataclass(frozen=True)
class StorageUrlType(ValueType[str]):
    """Empty, or a URL whose scheme names a storage engine (``storage.engines``)."""

    def parse(self, text: str) -> str:
        if not self.check(text):
            raise ValueError(text)
        return text

    def shown(self, text: str) -> str:
        return shown_url(text) if "://" in text else text

    def check(self, value: object) -> bool:
        if not isinstance(value, str):
            return False
        try:
            return value == "" or bool(storage_scheme(value))
        except ValueError:
            return False

    def expected(self) -> str:
        return f"empty or a URL of scheme {' or '.join(sorted(ENGINES))}"


@dataclass(frozen=True)
class NameType(ValueType[str]):
    """A tenant or namespace name, by the rule logins and topic names follow
    (``common.names``)."""

    def parse(self, text: str) -> str:
        if not self.check(text):
            raise ValueError(text)
        return text

    def check(self, value: object) -> bool:
        return isinstance(value, str) and is_valid_name(value)

    def expected(self) -> str:
        return f"a non-empty name of {NAME_RULE}"


@dataclass(frozen=True)
class ChoiceType(ValueType[str]):
    """One of a fixed set of upper-case words, accepted in any case."""

    choices: tuple[str, ...]

    def parse(self, text: str) -> str:
        upper = text.upper()
        if upper not in self.choices:
            raise ValueError(text)
        return upper

    def check(self, value: object) -> bool:
        return value in self.choices

    def expected(self) -> str:
        return "one of " + ", ".join(self.choices)


# ---------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class ConfigKey:
    """One configuration key: property name, attribute, value type, default and doc."""

    name: str
    attr: str
    value_type: ValueType[Any]
    default: Any
    doc: str

    def parse(self, text: str) -> Any:
        """The value of ``text`` for this key; raises ConfigError naming the key."""
        stripped = text.strip()
        try:
            return self.value_type.parse(stripped)
        except ValueError:
            raise ConfigError(self._invalid(self.value_type.shown(stripped))) from None

    def validate(self, value: object) -> None:
        """Raise ConfigError naming the key if a typed ``value`` is not acceptable."""
        if not self.value_type.check(value):
            raise ConfigError(self._invalid(str(value)))

    def _invalid(self, shown: str) -> str:
        return (
            f"invalid value {shown!r} for {self.name!r}:"
            f" expected {self.value_type.expected()}"
        )


def _key(name: str, value_type: ValueType[Any], doc: str) -> dict[str, Any]:
    """Field metadata declaring a configuration key (the attribute name comes later)."""
    return {"config": (name, value_type, doc)}


_LISTENER_KEYS = {
    "listeners": "kafkaListeners",
    "protocol_map": "kafkaProtocolMap",
    "advertised": "kafkaAdvertisedListeners",
}


@dataclass(frozen=True)
class BrokerConfig:
    """The validated broker configuration; construct it directly or via :func:`load_config`.

    Construction validates every field and the listener settings, raising ConfigError.
    """

    broker_id: int = field(
        default=0, metadata=_key("brokerId", IntType(0, INT_MAX), "stable node id")
    )
    broker_rack: str = field(
        default="", metadata=_key("brokerRack", StrType(allow_empty=True),
                                  "rack of this broker, shown in Metadata (empty = none)")
    )
    broker_session_timeout_ms: int = field(
        default=6000,
        metadata=_key("brokerSessionTimeoutMs", IntType(500, INT_MAX),
                      "a broker whose lease is not renewed for this long is dead and its "
                      "partitions move (shorter: faster failover; longer: fewer false "
                      "failovers when a broker or the database stalls)"),
    )
    broker_heartbeat_interval_ms: int = field(
        default=1000,
        metadata=_key("brokerHeartbeatIntervalMs", IntType(50, INT_MAX),
                      "how often a broker renews its lease and rebalances partition "
                      "ownership; keep it well below `brokerSessionTimeoutMs`"),
    )
    kafka_listeners: str = field(
        default="PLAINTEXT://127.0.0.1:9092",
        metadata=_key(
            "kafkaListeners",
            StrType(allow_empty=False),
            "listeners, `NAME://host:port,...`; NAME is a security protocol unless"
            " `kafkaProtocolMap` is set",
        ),
    )
    kafka_advertised_listeners: str = field(
        default="",
        metadata=_key(
            "kafkaAdvertisedListeners",
            StrType(),
            "addresses given to clients, same format and names as `kafkaListeners`;"
            " a listener without an entry advertises its bind address",
        ),
    )
    kafka_protocol_map: str = field(
        default="",
        metadata=_key(
            "kafkaProtocolMap", StrType(), "listener name to protocol, `NAME:PROTOCOL,...`"
        ),
    )
    kafka_tenant: str = field(
        default="public",
        metadata=_key("kafkaTenant", NameType(), "tenant of short topic names"),
    )
    kafka_namespace: str = field(
        default="default",
        metadata=_key("kafkaNamespace", NameType(), "namespace of short topic names"),
    )
    validate_records: bool = field(
        default=False,
        metadata=_key(
            "validateRecords",
            BoolType(),
            "walk every record of a produced batch, as Kafka does, and answer INVALID_RECORD "
            "for one that does not parse (costs about 3 us a record, plus inflating compressed "
            "batches, at most to 64 MiB; off: the records are "
            "opaque and only the batch header and CRC are checked)",
        ),
    )
    allow_auto_topic_creation: bool = field(
        default=True,
        metadata=_key(
            "allowAutoTopicCreation",
            BoolType(),
            "create topics on Metadata/Produce for unknown names",
        ),
    )
    default_num_partitions: int = field(
        default=1,
        metadata=_key(
            "defaultNumPartitions", IntType(1, INT_MAX), "partitions of auto-created topics"
        ),
    )
    data_dir: str = field(
        default="./data",
        metadata=_key("dataDir", StrType(allow_empty=False), "storage root (file storage)"),
    )
    storage_url: str = field(
        default="",
        metadata=_key(
            "storageUrl",
            StorageUrlType(),
            "storage engine: `file:///abs/path` (the managed ledger on local files) or "
            "`memory://` (in this process only, gone at exit) or "
            "`postgres://user@host:port/db` (a PostgreSQL database); empty = "
            "`file://<absolute dataDir>`",
        ),
    )
    max_frame_bytes: int = field(
        default=104857600,
        metadata=_key(
            "maxFrameBytes", IntType(1, INT_MAX), "largest request frame accepted, in bytes"
        ),
    )
    flush_interval_messages: int = field(
        default=LONG_MAX,
        metadata=_key(
            "flushIntervalMessages",
            IntType(1),
            "fsync a partition once this many messages are unflushed;"
            " 1 = fsync before every acknowledgement",
        ),
    )
    flush_interval_ms: int = field(
        default=1000,
        metadata=_key(
            "flushIntervalMs",
            IntType(0),
            "fsync all dirty partitions at least this often (ms); 0 = no periodic fsync",
        ),
    )
    log_segment_bytes: int = field(
        default=1073741824,
        metadata=_key("logSegmentBytes", IntType(1024), "ledger rollover size, in bytes"),
    )
    log_segment_ms: int = field(
        default=604800000,
        metadata=_key("logSegmentMs", IntType(1), "ledger rollover age (ms)"),
    )
    log_retention_ms: int = field(
        default=604800000,
        metadata=_key(
            "logRetentionMs", IntType(-1), "default retention by time (ms); -1 = forever"
        ),
    )
    log_retention_bytes: int = field(
        default=-1,
        metadata=_key(
            "logRetentionBytes",
            IntType(-1),
            "default retention by size per partition, in bytes; -1 = unlimited",
        ),
    )
    log_retention_check_interval_ms: int = field(
        default=300000,
        metadata=_key(
            "logRetentionCheckIntervalMs", IntType(1), "how often retention is applied (ms)"
        ),
    )
    max_queued_requests: int = field(
        default=500,
        metadata=_key(
            "maxQueuedRequests", IntType(1), "requests read ahead per connection"
        ),
    )
    fetch_max_bytes: int = field(
        default=57671680,
        metadata=_key(
            "fetchMaxBytes", IntType(1, INT_MAX),
            "most record bytes one Fetch response carries, whatever the client asks"
            " (Kafka's `fetch.max.bytes`; a first batch larger than it is still sent whole)",
        ),
    )
    max_pending_response_bytes: int = field(
        default=8388608,
        metadata=_key(
            "maxPendingResponseBytes", IntType(1, INT_MAX),
            "response bytes one connection may hold: finished and not yet sent, or still"
            " to come from its running requests (a Fetch counts its limits); a request"
            " that does not fit waits, unless nothing else is held",
        ),
    )
    connection_max_idle_ms: int = field(
        default=600000,
        metadata=_key(
            "connectionMaxIdleMs",
            IntType(0),
            "close connections idle this long (ms); 0 = no idle timeout",
        ),
    )
    kafka_metadata_tenant: str = field(
        default="public",
        metadata=_key("kafkaMetadataTenant", NameType(),
                      "tenant of system topics such as __consumer_offsets"),
    )
    kafka_metadata_namespace: str = field(
        default="__kafka",
        metadata=_key("kafkaMetadataNamespace", NameType(), "namespace of system topics"),
    )
    kafka_enable_multi_tenant_metadata: bool = field(
        default=True,
        metadata=_key(
            "kafkaEnableMultiTenantMetadata", BoolType(),
            "keep each tenant's groups in its own <tenant>/<kafkaMetadataNamespace> system "
            "topics instead of the metadata tenant's",
        ),
    )
    group_min_session_timeout_ms: int = field(
        default=6000,
        metadata=_key("groupMinSessionTimeoutMs", IntType(1, INT_MAX),
                      "smallest session timeout a group member may ask for (ms)"),
    )
    group_max_session_timeout_ms: int = field(
        default=300000,
        metadata=_key("groupMaxSessionTimeoutMs", IntType(1, INT_MAX),
                      "largest session timeout a group member may ask for (ms)"),
    )
    group_initial_rebalance_delay_ms: int = field(
        default=3000,
        metadata=_key("groupInitialRebalanceDelayMs", IntType(0, INT_MAX),
                      "how long the first rebalance of an empty group waits for more "
                      "members (ms)"),
    )
    group_id_max_length: int = field(
        default=255,
        metadata=_key("groupIdMaxLength", IntType(1, 32767),
                      "longest group id accepted, in characters (INVALID_GROUP_ID beyond)"),
    )
    offsets_topic_num_partitions: int = field(
        default=50,
        metadata=_key("offsetsTopicNumPartitions", IntType(1, 10000),
                      "partitions of a new __consumer_offsets topic; an existing topic keeps "
                      "its count, so no committed offset is lost when this changes"),
    )
    offsets_topic_segment_bytes: int = field(
        default=16 * 1024 * 1024,
        metadata=_key("offsetsTopicSegmentBytes", IntType(1024),
                      "ledger size of __consumer_offsets partitions, in bytes"),
    )
    offsets_topic_compaction_bytes: int = field(
        default=64 * 1024 * 1024,
        metadata=_key("offsetsTopicCompactionBytes", IntType(1024),
                      "when a __consumer_offsets partition holds this many bytes, its live "
                      "groups and offsets are written again and older ledgers dropped"),
    )
    offset_metadata_max_size: int = field(
        default=4096,
        metadata=_key("offsetMetadataMaxSize", IntType(0, INT_MAX),
                      "longest metadata string of a committed offset "
                      "(OFFSET_METADATA_TOO_LARGE beyond)"),
    )
    offsets_retention_minutes: int = field(
        default=4320,
        metadata=_key("offsetsRetentionMinutes", IntType(1, INT_MAX),
                      "committed offsets of a group that has been empty this long are "
                      "removed"),
    )
    offsets_retention_check_interval_ms: int = field(
        default=600000,
        metadata=_key("offsetsRetentionCheckIntervalMs", IntType(1),
                      "how often expired offsets are looked for (ms)"),
    )
    kafka_transaction_coordinator_enabled: bool = field(
        default=True,
        metadata=_key("kafkaTransactionCoordinatorEnabled", BoolType(),
                      "serve transactions (InitProducerId with a transactional id, "
                      "AddPartitionsToTxn, EndTxn, ...)"),
    )
    kafka_txn_log_topic_num_partitions: int = field(
        default=50,
        metadata=_key("kafkaTxnLogTopicNumPartitions", IntType(1, 10000),
                      "partitions of a new __transaction_state topic"),
    )
    transaction_max_timeout_ms: int = field(
        default=900000,
        metadata=_key("transactionMaxTimeoutMs", IntType(1, INT_MAX),
                      "largest transaction.timeout.ms a producer may ask for "
                      "(INVALID_TRANSACTION_TIMEOUT beyond)"),
    )
    transactional_id_expiration_ms: int = field(
        default=604800000,
        metadata=_key("transactionalIdExpirationMs", IntType(1, INT_MAX),
                      "a transactional id unused this long is forgotten"),
    )
    producer_id_expiration_ms: int = field(
        default=86400000,
        metadata=_key("producerIdExpirationMs", IntType(1, INT_MAX),
                      "a producer id that wrote nothing to a partition this long (by its "
                      "batches' timestamps) and has no open transaction there is forgotten "
                      "by that partition (Kafka's producer.id.expiration.ms)"),
    )
    producer_id_expiration_check_interval_ms: int = field(
        default=600000,
        metadata=_key("producerIdExpirationCheckIntervalMs", IntType(1, INT_MAX),
                      "how often idle producer ids are looked for"),
    )
    transaction_abort_timed_out_transactions_interval_ms: int = field(
        default=10000,
        metadata=_key("transactionAbortTimedOutTransactionsIntervalMs", IntType(1, INT_MAX),
                      "how often transactions past their timeout are looked for and aborted"),
    )
    audit_enabled: bool = field(
        default=True,
        metadata=_key("auditEnabled", BoolType(),
                      "write a JSON event per login outcome, authorization denial and rejected "
                      "connection to `<kafkaMetadataTenant>/<kafkaMetadataNamespace>/__audit`"),
    )
    metrics_port: int = field(
        default=0,
        metadata=_key("metricsPort", IntType(0, 65535),
                      "port of the Prometheus endpoint `/metrics`; 0 = off"),
    )
    metrics_host: str = field(
        default="127.0.0.1",
        metadata=_key("metricsHost", StrType(allow_empty=False),
                      "address the Prometheus endpoint binds"),
    )
    sasl_allowed_mechanisms: str = field(
        default="PLAIN",
        metadata=_key("saslAllowedMechanisms", StrType(),
                      "SASL mechanisms offered on SASL listeners: PLAIN, OAUTHBEARER "
                      "(comma-separated)"),
    )
    sasl_listener_mechanisms: str = field(
        default="",
        metadata=_key("saslListenerMechanisms", StrType(),
                      "per-listener override, `NAME:MECH+MECH,NAME:MECH`"),
    )
    token_secret_key: str = field(
        default="",
        metadata=_key("tokenSecretKey", StrType(),
                      "HMAC secret for `token:` passwords, as `data:;base64,...` or `file:` URL"),
    )
    token_public_key: str = field(
        default="",
        metadata=_key("tokenPublicKey", StrType(),
                      "RSA or EC public key (PEM or DER) for `token:` passwords, as `data:` "
                      "or `file:` URL"),
    )
    token_auth_claim: str = field(
        default="sub",
        metadata=_key("tokenAuthClaim", StrType(allow_empty=False),
                      "token claim that names the role (the principal)"),
    )
    token_audience_claim: str = field(
        default="",
        metadata=_key("tokenAudienceClaim", StrType(),
                      "token claim checked against `tokenAudience` (default `aud`)"),
    )
    token_audience: str = field(
        default="",
        metadata=_key("tokenAudience", StrType(),
                      "audience a token must carry; empty = not checked"),
    )
    token_expiration: str = field(
        default="REQUIRED",
        metadata=_key("tokenExpiration", ChoiceType(("REQUIRED", "OPTIONAL")),
                      "`required`: a token (PLAIN `token:` and OAUTHBEARER) without an `exp` "
                      "claim is refused; `optional`: such a token never expires (the "
                      "behaviour before this key; OAUTHBEARER with the issuer's JWKS always "
                      "requires `exp`)"),
    )
    token_max_lifetime_seconds: int = field(
        default=0,
        metadata=_key("tokenMaxLifetimeSeconds", IntType(0, INT_MAX),
                      "refuse a token whose lifetime is longer (`exp` - `iat`, or `exp` - "
                      "now without `iat`), PLAIN and OAUTHBEARER alike; 0 = no limit (the "
                      "default: off); a day (86400) or less is recommended"),
    )
    kop_oauth2_config_file: str = field(
        default="",
        metadata=_key("kopOauth2ConfigFile", StrType(),
                      "properties file of the OAUTHBEARER validator (oauth.* keys)"),
    )
    failed_authentication_delay_ms: int = field(
        default=300,
        metadata=_key("failedAuthenticationDelayMs", IntType(0, INT_MAX),
                      "wait before answering a failed login (ms)"),
    )
    connections_max_reauth_ms: int = field(
        default=0,
        metadata=_key("connectionsMaxReauthMs", IntType(0),
                      "longest SASL session before re-authentication (ms); 0 = only the "
                      "token's expiry limits it"),
    )
    tls_certificate_file_path: str = field(
        default="",
        metadata=_key("tlsCertificateFilePath", StrType(),
                      "PEM certificate (chain) of SSL and SASL_SSL listeners"),
    )
    tls_key_file_path: str = field(
        default="",
        metadata=_key("tlsKeyFilePath", StrType(), "PEM private key of that certificate"),
    )
    tls_trust_certs_file_path: str = field(
        default="",
        metadata=_key("tlsTrustCertsFilePath", StrType(),
                      "PEM CA certificates trusted for client certificates"),
    )
    tls_require_trusted_client_cert_on_connect: bool = field(
        default=False,
        metadata=_key("tlsRequireTrustedClientCertOnConnect", BoolType(),
                      "require a client certificate; on SSL listeners its common name is "
                      "the principal"),
    )
    max_connections_per_listener: int = field(
        default=10000,
        metadata=_key("maxConnectionsPerListener", IntType(1, INT_MAX),
                      "connections a listener accepts at once; more are closed"),
    )
    sasl_server_max_receive_size: int = field(
        default=524288,
        metadata=_key("saslServerMaxReceiveSize", IntType(1, INT_MAX),
                      "largest frame accepted on a SASL listener before login, in bytes"
                      " (Kafka's `sasl.server.max.receive.size`); a larger one closes the"
                      " connection"),
    )
    max_unauthenticated_buffered_bytes: int = field(
        default=67108864,
        metadata=_key("maxUnauthenticatedBufferedBytes", IntType(1, INT_MAX),
                      "bytes that frames larger than 16 KiB of connections not yet logged"
                      " in may hold at once, counted as they arrive (smaller ones, any"
                      " login, are not counted); a frame beyond it closes its connection"),
    )
    authorization_enabled: bool = field(
        default=False,
        metadata=_key("authorizationEnabled", BoolType(),
                      "check ACLs on every request (superusers pass every check)"),
    )
    super_user_roles: str = field(
        default="",
        metadata=_key("superUserRoles", StrType(), "roles that pass every check, comma-separated"),
    )
    kop_allowed_namespaces: str = field(
        default="",
        metadata=_key("kopAllowedNamespaces", StrType(),
                      "namespaces listed by 'all topics', e.g. `${tenant}/default,${tenant}/*`; "
                      "empty = the login's namespace"),
    )
    log_level: str = field(
        default="INFO",
        metadata=_key(
            "logLevel", ChoiceType(("DEBUG", "INFO", "WARNING", "ERROR")), "logging level"
        ),
    )
    explicit_keys: frozenset[str] = field(default=frozenset(), repr=False, compare=False)
    """The keys the file or an override named (``load_config`` fills it in), so start-up
    can tell a value the operator chose from a default."""
    _listener_specs: tuple[ListenerSpec, ...] = field(
        init=False, repr=False, compare=False, default=()
    )

    def __post_init__(self) -> None:
        for key in CONFIG_KEYS.values():
            key.validate(getattr(self, key.attr))
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
            specs = parse_listeners(
                self.kafka_listeners, self.kafka_protocol_map, self.kafka_advertised_listeners
            )
        except ListenerConfigError as exc:
            name = _LISTENER_KEYS[exc.source]
            shown = getattr(self, CONFIG_KEYS[name].attr)
            raise ConfigError(f"invalid value {shown!r} for {name!r}: {exc}") from None
        object.__setattr__(self, "_listener_specs", tuple(specs))

    def effective_storage_url(self) -> str:
        """``storageUrl``, or the file URL of ``dataDir`` made absolute when it is empty."""
        return self.storage_url or Path(self.data_dir).resolve().as_uri()

    def listener_specs(self) -> list[ListenerSpec]:
        """The parsed listeners, in the order configured."""
        return list(self._listener_specs)

    def to_properties(self) -> dict[str, str]:
        """Every key as properties text (``load_config`` of these gives an equal config)."""
        return {
            key.name: key.value_type.format(getattr(self, key.attr))
            for key in CONFIG_KEYS.values()
        }


def _build_registry() -> dict[str, ConfigKey]:
    keys: dict[str, ConfigKey] = {}
    for item in dataclasses.fields(BrokerConfig):
        if "config" not in item.metadata:
            continue
        name, value_type, doc = item.metadata["config"]
        keys[name] = ConfigKey(name, item.name, value_type, item.default, doc)
    return keys


CONFIG_KEYS: Mapping[str, ConfigKey] = MappingProxyType(_build_registry())
"""Every configuration key by property name, in declaration order."""


# ----------------------------------------------------------------------------- loading


def _apply(values: dict[str, Any], name: str, text: str) -> str:
    """Parse ``text`` into ``values`` for key ``name``; return the key's name."""
    key = CONFIG_KEYS.get(name)
    if key is None:
        raise ConfigError(f"unknown config key {name!r}")
    values[key.attr] = key.parse(text)
    return key.name


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> BrokerConfig:
    """Read ``path`` (if given), apply ``key=value`` overrides in order, and validate.

    Raises ConfigError for an unreadable file, a malformed override, an unknown key or
    an invalid value; the message names the file, override or key at fault.
    """
    values: dict[str, Any] = {}
    explicit: set[str] = set()
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config file {str(path)!r}: {exc}") from None
        try:
            properties = parse_properties(text)
            for name, value in properties.items():
                explicit.add(_apply(values, name, value))
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    for override in overrides:
        name, sep, value = override.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"malformed override {override!r}: expected key=value")
        explicit.add(_apply(values, name.strip(), value))
    return BrokerConfig(**values, explicit_keys=frozenset(explicit))


def config_reference_markdown() -> str:
    """A Markdown table of every key: name, type, default and meaning."""
    rows = [
        "| key | value | default | meaning |",
        "|---|---|---|---|",
    ]
    for key in CONFIG_KEYS.values():
        default = key.value_type.format(key.default)
        shown = f"`{default}`" if default else '`""`'
        rows.append(f"| `{key.name}` | {key.value_type.expected()} | {shown} | {key.doc} |")
    return "\n".join(rows) + "\n"
