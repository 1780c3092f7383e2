"""Broker configuration: a Java properties file plus ``key=value`` overrides.

Every key is declared once, as a field of the pydantic model :class:`BrokerConfig`::

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
the ``config-table`` markers) are derived from the declarations; a check across keys goes
in :meth:`BrokerConfig._check_across_keys`.

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
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError, model_validator

from common.settings import LONG_MAX, declared_keys, first_problem, key, to_text
from edge.config_types import (
    INT_MAX,
    CompressionType,
    ConfigError,
    ConfigKey,
    ConfigValue,
    Name,
    SecretKeyUrl,
    StorageUrl,
)
from edge.log_format import LogFormat
from edge.properties import parse_properties
from listeners.spec import ListenerConfigError, ListenerSpec, parse_listeners

__all__ = [
    "CONFIG_KEYS",
    "BrokerConfig",
    "ConfigError",
    "ConfigKey",
    "config_reference_markdown",
    "load_config",
    "parse_properties",
]

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
TokenExpiration = Literal["REQUIRED", "OPTIONAL"]

_LISTENER_KEYS = {
    "listeners": "kafkaListeners",
    "protocol_map": "kafkaProtocolMap",
    "advertised": "kafkaAdvertisedListeners",
}


class BrokerConfig(BaseModel):
    """The validated broker configuration; construct it directly (by attribute or
    property name) or via :func:`load_config`.  Construction validates every field and
    the listener settings, raising ConfigError; the model is frozen."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True,
                              validate_by_name=True, validate_by_alias=True)

    broker_id: Annotated[int, key("brokerId", "stable node id", ge=0, le=INT_MAX)] = 0
    broker_rack: Annotated[str, key(
        "brokerRack",
        "rack of this broker, shown in Metadata (empty = none)")] = ""
    broker_session_timeout_ms: Annotated[int, key(
        "brokerSessionTimeoutMs",
        "a broker whose lease is not renewed for this long is dead and its partitions move "
        "(shorter: faster failover; longer: fewer false failovers when a broker or the "
        "database stalls)", ge=500, le=INT_MAX)] = 6000
    broker_heartbeat_interval_ms: Annotated[int, key(
        "brokerHeartbeatIntervalMs",
        "how often a broker renews its lease and rebalances partition ownership; keep it well"
        " below `brokerSessionTimeoutMs`", ge=50, le=INT_MAX)] = 1000
    kafka_listeners: Annotated[str, key(
        "kafkaListeners",
        "listeners, `NAME://host:port,...`; NAME is a security protocol unless "
        "`kafkaProtocolMap` is set", min_length=1)] = "PLAINTEXT://127.0.0.1:9092"
    kafka_advertised_listeners: Annotated[str, key(
        "kafkaAdvertisedListeners",
        "addresses given to clients, same format and names as `kafkaListeners`; a listener "
        "without an entry advertises its bind address")] = ""
    kafka_protocol_map: Annotated[str, key(
        "kafkaProtocolMap",
        "listener name to protocol, `NAME:PROTOCOL,...`")] = ""
    kafka_tenant: Annotated[Name, key("kafkaTenant", "tenant of short topic names")] = "public"
    kafka_namespace: Annotated[Name, key(
        "kafkaNamespace",
        "namespace of short topic names")] = "default"
    validate_records: Annotated[bool, key(
        "validateRecords",
        "walk every record of a produced batch, as Kafka does, and answer INVALID_RECORD for "
        "one that does not parse, so that no batch that stalls consumers is acknowledged "
        "(in C when `make` built the walker: about 0.03 us a record and 1.5 us a batch; "
        "else in Python: about 3 us a record; plus inflating compressed batches, at most "
        "to 64 MiB; off: the records are opaque and only the batch header and CRC are "
        "checked)")] = True
    allow_auto_topic_creation: Annotated[bool, key(
        "allowAutoTopicCreation",
        "create topics on Metadata/Produce for unknown names")] = True
    default_num_partitions: Annotated[int, key(
        "defaultNumPartitions",
        "partitions of auto-created topics", ge=1, le=INT_MAX)] = 1
    data_dir: Annotated[str, key("dataDir", "storage root (file storage)", min_length=1)] = "./data"
    storage_url: Annotated[StorageUrl, key(
        "storageUrl",
        "storage engine: `file:///abs/path` (the managed ledger on local files) or "
        "`memory://` (in this process only, gone at exit) or `postgres://user@host:port/db` "
        "(a PostgreSQL database); empty = `file://<absolute dataDir>`")] = ""
    max_frame_bytes: Annotated[int, key(
        "maxFrameBytes",
        "largest request frame accepted, in bytes", ge=1, le=INT_MAX)] = 104857600
    flush_interval_messages: Annotated[int, key(
        "flushIntervalMessages",
        "fsync a partition once this many messages are unflushed; 1 = fsync before every "
        "acknowledgement", ge=1)] = LONG_MAX
    flush_interval_ms: Annotated[int, key(
        "flushIntervalMs",
        "fsync all dirty partitions at least this often (ms); 0 = no periodic fsync", ge=0)] = 1000
    log_segment_bytes: Annotated[int, key(
        "logSegmentBytes",
        "ledger rollover size, in bytes", ge=1024)] = 1073741824
    log_segment_ms: Annotated[int, key(
        "logSegmentMs",
        "ledger rollover age (ms)", ge=1)] = 604800000
    compression_type: Annotated[CompressionType, key(
        "compressionType",
        "codec topics store batches in unless they set `compression.type` (Kafka's "
        "broker `compression.type`): `producer` keeps the producer's; a batch in another "
        "codec is compressed again on its way in, in an executor thread")] = "producer"
    log_retention_ms: Annotated[int, key(
        "logRetentionMs",
        "default retention by time (ms); -1 = forever", ge=-1)] = 604800000
    log_retention_bytes: Annotated[int, key(
        "logRetentionBytes",
        "default retention by size per partition, in bytes; -1 = unlimited", ge=-1)] = -1
    log_retention_check_interval_ms: Annotated[int, key(
        "logRetentionCheckIntervalMs",
        "how often retention is applied (ms)", ge=1)] = 300000
    log_cleaner_enable: Annotated[bool, key(
        "logCleanerEnable",
        "run the log cleaner, which keeps the latest record of each key in topics whose "
        "`cleanup.policy` includes `compact` (Kafka's `log.cleaner.enable`)")] = True
    log_cleaner_backoff_ms: Annotated[int, key(
        "logCleanerBackoffMs",
        "how often the log cleaner looks for partitions to clean (ms; Kafka's "
        "`log.cleaner.backoff.ms`)", ge=1)] = 15000
    log_cleaner_io_max_bytes_per_second: Annotated[int, key(
        "logCleanerIoMaxBytesPerSecond",
        "most bytes the log cleaner reads and writes per second, together (Kafka's "
        "`log.cleaner.io.max.bytes.per.second`); 0 = no limit", ge=0)] = 52428800
    log_cleaner_dedupe_buffer_size: Annotated[int, key(
        "logCleanerDedupeBufferSize",
        "most memory the log cleaner's map of keys takes in one cleaning, in bytes (Kafka's "
        "`log.cleaner.dedupe.buffer.size`; each key counts its length plus 100 bytes); a "
        "partition whose dirty part has more keys is cleaned over several rounds (at least "
        "one batch per round)", ge=1)] = 134217728
    max_queued_requests: Annotated[int, key(
        "maxQueuedRequests",
        "requests read ahead per connection", ge=1)] = 500
    fetch_max_bytes: Annotated[int, key(
        "fetchMaxBytes",
        "most record bytes one Fetch response carries, whatever the client asks (Kafka's "
        "`fetch.max.bytes`; a first batch larger than it is still sent whole)",
        ge=1, le=INT_MAX)] = 57671680
    max_pending_response_bytes: Annotated[int, key(
        "maxPendingResponseBytes",
        "response bytes one connection may hold: finished and not yet sent, or still to come "
        "from its running requests (a Fetch counts its limits); a request that does not fit "
        "waits, unless nothing else is held", ge=1, le=INT_MAX)] = 8388608
    connection_max_idle_ms: Annotated[int, key(
        "connectionMaxIdleMs",
        "close connections idle this long (ms); 0 = no idle timeout", ge=0)] = 600000
    kafka_metadata_tenant: Annotated[Name, key(
        "kafkaMetadataTenant",
        "tenant of system topics such as __consumer_offsets")] = "public"
    kafka_metadata_namespace: Annotated[Name, key(
        "kafkaMetadataNamespace",
        "namespace of system topics")] = "__kafka"
    kafka_enable_multi_tenant_metadata: Annotated[bool, key(
        "kafkaEnableMultiTenantMetadata",
        "keep each tenant's groups in its own <tenant>/<kafkaMetadataNamespace> system topics"
        " instead of the metadata tenant's")] = True
    group_min_session_timeout_ms: Annotated[int, key(
        "groupMinSessionTimeoutMs",
        "smallest session timeout a group member may ask for (ms)", ge=1, le=INT_MAX)] = 6000
    group_max_session_timeout_ms: Annotated[int, key(
        "groupMaxSessionTimeoutMs",
        "largest session timeout a group member may ask for (ms)", ge=1, le=INT_MAX)] = 300000
    group_initial_rebalance_delay_ms: Annotated[int, key(
        "groupInitialRebalanceDelayMs",
        "how long the first rebalance of an empty group waits for more members (ms)",
        ge=0, le=INT_MAX)] = 3000
    group_id_max_length: Annotated[int, key(
        "groupIdMaxLength",
        "longest group id accepted, in characters (INVALID_GROUP_ID beyond)", ge=1, le=32767)] = 255
    offsets_topic_num_partitions: Annotated[int, key(
        "offsetsTopicNumPartitions",
        "partitions of a new __consumer_offsets topic; an existing topic keeps its count, so "
        "no committed offset is lost when this changes", ge=1, le=10000)] = 50
    offsets_topic_segment_bytes: Annotated[int, key(
        "offsetsTopicSegmentBytes",
        "ledger size of __consumer_offsets partitions, in bytes", ge=1024)] = 16777216
    offsets_topic_compaction_bytes: Annotated[int, key(
        "offsetsTopicCompactionBytes",
        "when a __consumer_offsets partition holds this many bytes, its live groups and "
        "offsets are written again and older ledgers dropped", ge=1024)] = 67108864
    offset_metadata_max_size: Annotated[int, key(
        "offsetMetadataMaxSize",
        "longest metadata string of a committed offset (OFFSET_METADATA_TOO_LARGE beyond)",
        ge=0, le=INT_MAX)] = 4096
    offsets_retention_minutes: Annotated[int, key(
        "offsetsRetentionMinutes",
        "committed offsets of a group that has been empty this long are removed",
        ge=1, le=INT_MAX)] = 4320
    offsets_retention_check_interval_ms: Annotated[int, key(
        "offsetsRetentionCheckIntervalMs",
        "how often expired offsets are looked for (ms)", ge=1)] = 600000
    kafka_transaction_coordinator_enabled: Annotated[bool, key(
        "kafkaTransactionCoordinatorEnabled",
        "serve transactions (InitProducerId with a transactional id, AddPartitionsToTxn, "
        "EndTxn, ...)")] = True
    kafka_txn_log_topic_num_partitions: Annotated[int, key(
        "kafkaTxnLogTopicNumPartitions",
        "partitions of a new __transaction_state topic", ge=1, le=10000)] = 50
    transaction_max_timeout_ms: Annotated[int, key(
        "transactionMaxTimeoutMs",
        "largest transaction.timeout.ms a producer may ask for (INVALID_TRANSACTION_TIMEOUT "
        "beyond)", ge=1, le=INT_MAX)] = 900000
    transactional_id_expiration_ms: Annotated[int, key(
        "transactionalIdExpirationMs",
        "a transactional id unused this long is forgotten", ge=1, le=INT_MAX)] = 604800000
    producer_id_expiration_ms: Annotated[int, key(
        "producerIdExpirationMs",
        "a producer id that wrote nothing to a partition this long (by its batches' "
        "timestamps) and has no open transaction there is forgotten by that partition "
        "(Kafka's producer.id.expiration.ms)", ge=1, le=INT_MAX)] = 86400000
    producer_id_expiration_check_interval_ms: Annotated[int, key(
        "producerIdExpirationCheckIntervalMs",
        "how often idle producer ids are looked for", ge=1, le=INT_MAX)] = 600000
    transaction_abort_timed_out_transactions_interval_ms: Annotated[int, key(
        "transactionAbortTimedOutTransactionsIntervalMs",
        "how often transactions past their timeout are looked for and aborted",
        ge=1, le=INT_MAX)] = 10000
    audit_enabled: Annotated[bool, key(
        "auditEnabled",
        "write a JSON event per login outcome, authorization denial and rejected connection "
        "to `<kafkaMetadataTenant>/<kafkaMetadataNamespace>/__audit`")] = True
    default_tenant_producer_byte_rate: Annotated[int, key(
        "defaultTenantProducerByteRate",
        "`producer_byte_rate` of each tenant without a quota of its own (bytes per second, "
        "shared by the tenant's connections); a quota set by AlterClientQuotas for a user, "
        "client id, namespace or tenant overrides it; 0 = none", ge=0)] = 0
    default_tenant_consumer_byte_rate: Annotated[int, key(
        "defaultTenantConsumerByteRate",
        "`consumer_byte_rate` of each tenant without a quota of its own (bytes per second); "
        "0 = none", ge=0)] = 0
    default_tenant_request_percentage: Annotated[int, key(
        "defaultTenantRequestPercentage",
        "`request_percentage` of each tenant without a quota of its own (percent of one "
        "event loop's time spent on its requests); 0 = none", ge=0)] = 0
    default_tenant_connection_creation_rate: Annotated[int, key(
        "defaultTenantConnectionCreationRate",
        "`connection_creation_rate` of each tenant without a quota of its own (new "
        "connections per second, counted at login; beyond, a connection is closed); "
        "0 = none", ge=0)] = 0
    default_tenant_max_connections: Annotated[int, key(
        "defaultTenantMaxConnections",
        "`max_connections` of each tenant without a quota of its own (open connections of "
        "the tenant, on every broker of a cluster; beyond, a new one is closed at login); "
        "0 = none",
        ge=0)] = 0
    default_tenant_max_topics: Annotated[int, key(
        "defaultTenantMaxTopics",
        "`max_topics` of each tenant without a quota of its own (CreateTopics beyond "
        "answers POLICY_VIOLATION); 0 = none", ge=0)] = 0
    default_tenant_max_partitions: Annotated[int, key(
        "defaultTenantMaxPartitions",
        "`max_partitions` of each tenant without a quota of its own (CreateTopics and "
        "CreatePartitions beyond answer POLICY_VIOLATION); 0 = none", ge=0)] = 0
    default_tenant_max_stored_bytes: Annotated[int, key(
        "defaultTenantMaxStoredBytes",
        "`max_stored_bytes` of each tenant without a quota of its own (bytes its "
        "partitions hold; a produce beyond answers KAFKA_STORAGE_ERROR); 0 = none",
        ge=0)] = 0
    tenant_usage_check_interval_ms: Annotated[int, key(
        "tenantUsageCheckIntervalMs",
        "how often the bytes each tenant stores are summed up from the partitions' sizes "
        "(between two sums, produced bytes are added as they come)", ge=100,
        le=INT_MAX)] = 5000
    quota_window_num: Annotated[int, key(
        "quotaWindowNum",
        "samples a quota's rate is measured over (Kafka's `quota.window.num`)",
        ge=2, le=3600)] = 11
    quota_window_size_seconds: Annotated[int, key(
        "quotaWindowSizeSeconds",
        "length of one sample, in seconds (Kafka's `quota.window.size.seconds`)",
        ge=1, le=3600)] = 1
    metrics_port: Annotated[int, key(
        "metricsPort",
        "port of the Prometheus endpoint `/metrics`; 0 = off", ge=0, le=65535)] = 0
    metrics_host: Annotated[str, key(
        "metricsHost",
        "address the Prometheus endpoint binds", min_length=1)] = "127.0.0.1"
    sasl_allowed_mechanisms: Annotated[tuple[str, ...], key(
        "saslAllowedMechanisms",
        "SASL mechanisms offered on SASL listeners: PLAIN, OAUTHBEARER (comma-separated)"
        )] = ("PLAIN",)
    sasl_listener_mechanisms: Annotated[tuple[str, ...], key(
        "saslListenerMechanisms",
        "per-listener override, `NAME:MECH+MECH,NAME:MECH`")] = ()
    token_secret_key: Annotated[SecretKeyUrl, key(
        "tokenSecretKey",
        "HMAC secret for `token:` passwords, as `data:;base64,...` or `file:` URL")] = ""
    token_public_key: Annotated[str, key(
        "tokenPublicKey",
        "RSA or EC public key (PEM or DER) for `token:` passwords, as `data:` or `file:` URL")] = ""
    token_auth_claim: Annotated[str, key(
        "tokenAuthClaim",
        "token claim that names the role (the principal)", min_length=1)] = "sub"
    token_audience_claim: Annotated[str, key(
        "tokenAudienceClaim",
        "token claim checked against `tokenAudience` (default `aud`)")] = ""
    token_audience: Annotated[str, key(
        "tokenAudience",
        "audience a token must carry; empty = not checked")] = ""
    token_expiration: Annotated[TokenExpiration, key(
        "tokenExpiration",
        "`required`: a token (PLAIN `token:` and OAUTHBEARER) without an `exp` claim is "
        "refused; `optional`: such a token never expires (the behaviour before this key; "
        "OAUTHBEARER with the issuer's JWKS always requires `exp`)")] = "REQUIRED"
    token_max_lifetime_seconds: Annotated[int, key(
        "tokenMaxLifetimeSeconds",
        "refuse a token whose lifetime is longer (`exp` - `iat`, or `exp` - now without "
        "`iat`), PLAIN and OAUTHBEARER alike; 0 = no limit (the default: off); a day (86400) "
        "or less is recommended", ge=0, le=INT_MAX)] = 0
    kop_oauth2_config_file: Annotated[str, key(
        "kopOauth2ConfigFile",
        "properties file of the OAUTHBEARER validator (oauth.* keys)")] = ""
    failed_authentication_delay_ms: Annotated[int, key(
        "failedAuthenticationDelayMs",
        "wait before answering a failed login (ms)", ge=0, le=INT_MAX)] = 300
    connections_max_reauth_ms: Annotated[int, key(
        "connectionsMaxReauthMs",
        "longest SASL session before re-authentication (ms); 0 = only the token's expiry "
        "limits it", ge=0)] = 0
    tls_certificate_file_path: Annotated[str, key(
        "tlsCertificateFilePath",
        "PEM certificate (chain) of SSL and SASL_SSL listeners")] = ""
    tls_key_file_path: Annotated[str, key(
        "tlsKeyFilePath",
        "PEM private key of that certificate")] = ""
    tls_trust_certs_file_path: Annotated[str, key(
        "tlsTrustCertsFilePath",
        "PEM CA certificates trusted for client certificates")] = ""
    tls_require_trusted_client_cert_on_connect: Annotated[bool, key(
        "tlsRequireTrustedClientCertOnConnect",
        "require a client certificate; on SSL listeners its common name is the principal")] = False
    max_connections_per_listener: Annotated[int, key(
        "maxConnectionsPerListener",
        "connections a listener accepts at once; more are closed", ge=1, le=INT_MAX)] = 10000
    sasl_server_max_receive_size: Annotated[int, key(
        "saslServerMaxReceiveSize",
        "largest frame accepted on a SASL listener before login, in bytes (Kafka's "
        "`sasl.server.max.receive.size`); a larger one closes the connection",
        ge=1, le=INT_MAX)] = 524288
    max_unauthenticated_buffered_bytes: Annotated[int, key(
        "maxUnauthenticatedBufferedBytes",
        "bytes that frames larger than 16 KiB of connections not yet logged in may hold at "
        "once, counted as they arrive (smaller ones, any login, are not counted); a frame "
        "beyond it closes its connection", ge=1, le=INT_MAX)] = 67108864
    authorization_enabled: Annotated[bool, key(
        "authorizationEnabled",
        "check ACLs on every request (superusers pass every check)")] = False
    super_user_roles: Annotated[tuple[str, ...], key(
        "superUserRoles",
        "roles that pass every check, comma-separated")] = ()
    kop_allowed_namespaces: Annotated[tuple[str, ...], key(
        "kopAllowedNamespaces",
        "namespaces listed by 'all topics', e.g. `${tenant}/default,${tenant}/*`; empty = the"
        " login's namespace")] = ()
    log_level: Annotated[LogLevel, key("logLevel", "logging level")] = "INFO"
    log_format: Annotated[LogFormat, key(
        "logFormat",
        "`text`: one line per record, `time LEVEL logger: message`; `json`: one JSON object "
        "per line with `time`, `level`, `logger`, `message` and, where the record has them, "
        "`tenant`, `principal`, `client`, `client_id`, `listener`, `topic`, `group` (client "
        "text escaped and bounded in both)")] = "TEXT"

    _listener_specs: tuple[ListenerSpec, ...] = PrivateAttr(default=())

    def __init__(self, **values: object) -> None:
        try:
            super().__init__(**values)
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
            specs = parse_listeners(
                self.kafka_listeners, self.kafka_protocol_map, self.kafka_advertised_listeners
            )
        except ListenerConfigError as exc:
            name = _LISTENER_KEYS[exc.source]
            shown = getattr(self, CONFIG_KEYS[name].attr)
            raise ConfigError(f"invalid value {shown!r} for {name!r}: {exc}") from None
        self._listener_specs = tuple(specs)
        return self

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
