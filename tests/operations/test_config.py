"""Tests for edge.config: the properties parser, keys, defaults, validation, overrides."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from common.settings import to_text
from edge.config import (
    CONFIG_KEYS,
    BrokerConfig,
    ConfigError,
    config_reference_markdown,
    load_config,
    parse_properties,
)
from listeners.hosts import machine_host_name
from listeners.spec import SecurityProtocol

# --------------------------------------------------------------------- properties format


def test_separators() -> None:
    text = "a=1\nb:2\nc 3\nd\t4\ne = 5\nf : 6\ng\t=\t7\n"
    assert parse_properties(text) == {
        "a": "1",
        "b": "2",
        "c": "3",
        "d": "4",
        "e": "5",
        "f": "6",
        "g": "7",
    }


def test_only_the_first_separator_counts() -> None:
    assert parse_properties("a==b\nc::d\ne=f=g\nh i=j\nk = :l") == {
        "a": "=b",
        "c": ":d",
        "e": "f=g",
        "h": "i=j",
        "k": ":l",
    }


def test_key_without_value() -> None:
    assert parse_properties("alone\nempty=\nspaced   \n") == {
        "alone": "",
        "empty": "",
        "spaced": "",
    }


def test_comments_and_blank_lines() -> None:
    text = (
        "# comment\n! bang comment\n   # indented comment\n\t! indented\n"
        "\n   \n\f\nk=v # not a comment\n"
    )
    assert parse_properties(text) == {"k": "v # not a comment"}


def test_leading_whitespace_ignored_trailing_kept() -> None:
    assert parse_properties("   \t key = value  \n") == {"key": "value  "}


def test_line_continuation() -> None:
    text = "list = a,\\\n    b,\\\n\t  c\nnext=1\n"
    assert parse_properties(text) == {"list": "a,b,c", "next": "1"}


def test_continuation_inside_key() -> None:
    assert parse_properties("ke\\\n  y=v") == {"key": "v"}


def test_continued_line_that_looks_like_a_comment_is_not_one() -> None:
    assert parse_properties("k=a\\\n  # b\n") == {"k": "a# b"}


def test_comment_lines_do_not_continue() -> None:
    assert parse_properties("# comment \\\nk=v\n") == {"k": "v"}


def test_even_backslashes_do_not_continue() -> None:
    assert parse_properties("k=a\\\\\nj=b\n") == {"k": "a\\", "j": "b"}


def test_odd_backslashes_continue() -> None:
    assert parse_properties("k=a\\\\\\\nb\n") == {"k": "a\\b"}


def test_continuation_at_end_of_file() -> None:
    assert parse_properties("k=v\\") == {"k": "v"}
    assert parse_properties("k=v\\\n") == {"k": "v"}


def test_continuation_into_blank_line() -> None:
    assert parse_properties("k=v\\\n\nj=w") == {"k": "v", "j": "w"}


def test_escapes() -> None:
    text = r"k=tab\there\nnl back\\slash eq\= colon\: \u0041\u00e9\u20AC \q\ "
    assert parse_properties(text) == {
        "k": "tab\there\nnl back\\slash eq= colon: Aé€ q ",
    }


def test_escapes_in_keys() -> None:
    text = "a\\=b=1\nc\\:d:2\ne\\ f 3\n\\#g=4\n\\u0068=5\n"
    assert parse_properties(text) == {"a=b": "1", "c:d": "2", "e f": "3", "#g": "4", "h": "5"}


def test_escaped_leading_whitespace_of_value_is_kept() -> None:
    assert parse_properties("k=\\  v") == {"k": "  v"}


@pytest.mark.parametrize("bad", [r"k=\u12", r"k=\uXYZW", r"k=\u", r"\u00zzk=v"])
def test_malformed_unicode_escape(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"line 2: malformed \\uXXXX"):
        parse_properties("# first\n" + bad)


def test_line_endings() -> None:
    assert parse_properties("a=1\r\nb=2\rc=3\nd=\\\r\n  4") == {
        "a": "1",
        "b": "2",
        "c": "3",
        "d": "4",
    }


def test_last_duplicate_wins() -> None:
    assert parse_properties("k=1\nk=2\n") == {"k": "2"}


def test_unicode_text() -> None:
    assert parse_properties("k=héllo wörld") == {"k": "héllo wörld"}


# ---------------------------------------------------------------------- keys, defaults

EXPECTED_DEFAULTS: dict[str, object] = {
    "brokerId": 0,
    "brokerRack": "",
    "brokerSessionTimeoutMs": 6000,
    "brokerHeartbeatIntervalMs": 1000,
    "kafkaListeners": "PLAINTEXT://127.0.0.1:9092",
    "kafkaAdvertisedListeners": "",
    "kafkaProtocolMap": "",
    "kafkaTenant": "public",
    "kafkaNamespace": "default",
    "eventLoopSliceUs": 0,
    "validateRecords": True,
    "allowAutoTopicCreation": True,
    "defaultNumPartitions": 1,
    "dataDir": "./data",
    "storageUrl": "",
    "maxFrameBytes": 104857600,
    "flushIntervalMessages": 9223372036854775807,
    "flushIntervalMs": 1000,
    "logSegmentBytes": 1073741824,
    "logSegmentMs": 604800000,
    "compressionType": "producer",
    "logRetentionMs": 604800000,
    "logRetentionBytes": -1,
    "logRetentionCheckIntervalMs": 300000,
    "logCleanerEnable": True,
    "logCleanerBackoffMs": 15000,
    "logCleanerIoMaxBytesPerSecond": 52428800,
    "logCleanerDedupeBufferSize": 134217728,
    "maxQueuedRequests": 500,
    "fetchMaxBytes": 57671680,
    "maxPendingResponseBytes": 8388608,
    "connectionMaxIdleMs": 600000,
    "kafkaMetadataTenant": "public",
    "kafkaMetadataNamespace": "__kafka",
    "kafkaEnableMultiTenantMetadata": True,
    "groupMinSessionTimeoutMs": 6000,
    "groupMaxSessionTimeoutMs": 300000,
    "groupInitialRebalanceDelayMs": 3000,
    "groupIdMaxLength": 255,
    "groupMaxSize": 1000,
    "groupMetadataMaxBytes": 2097152,
    "offsetsTopicNumPartitions": 50,
    "offsetsTopicSegmentBytes": 16777216,
    "offsetsTopicCompactionBytes": 67108864,
    "offsetMetadataMaxSize": 4096,
    "offsetsRetentionMinutes": 4320,
    "offsetsRetentionCheckIntervalMs": 600000,
    "kafkaTransactionCoordinatorEnabled": True,
    "kafkaTxnLogTopicNumPartitions": 50,
    "transactionMaxTimeoutMs": 900000,
    "transactionalIdExpirationMs": 604800000,
    "producerIdExpirationMs": 86400000,
    "producerIdExpirationCheckIntervalMs": 600000,
    "transactionAbortTimedOutTransactionsIntervalMs": 10000,
    "auditEnabled": True,
    "auditDenialsPerWindow": 10,
    "auditRejectionsPerWindow": 100,
    "auditLoginFailuresPerWindow": 100,
    "auditDenialWindowMs": 10000,
    "defaultTenantProducerByteRate": 0,
    "defaultTenantConsumerByteRate": 0,
    "defaultTenantRequestPercentage": 0,
    "defaultTenantConnectionCreationRate": 0,
    "defaultTenantControllerMutationRate": 0,
    "defaultTenantMaxConnections": 0,
    "defaultTenantMaxTopics": 0,
    "defaultTenantMaxPartitions": 0,
    "defaultTenantMaxStoredBytes": 0,
    "maxQuotaEntitiesPerTenant": 1000,
    "tenantUsageCheckIntervalMs": 5000,
    "quotaWindowNum": 11,
    "quotaWindowSizeSeconds": 1,
    "metricsPort": 0,
    "metricsHost": "127.0.0.1",
    "saslAllowedMechanisms": ("PLAIN",),
    "saslListenerMechanisms": (),
    "tokenSecretKey": "",
    "tokenPublicKey": "",
    "tokenAuthClaim": "sub",
    "tokenAudienceClaim": "",
    "tokenAudience": "",
    "tokenExpiration": "REQUIRED",
    "tokenMaxLifetimeSeconds": 0,
    "kopOauth2ConfigFile": "",
    "failedAuthenticationDelayMs": 300,
    "connectionsMaxReauthMs": 0,
    "tlsCertificateFilePath": "",
    "tlsKeyFilePath": "",
    "tlsTrustCertsFilePath": "",
    "tlsRequireTrustedClientCertOnConnect": False,
    "tlsPrincipal": "CN",
    "maxConnectionsPerListener": 10000,
    "maxConnectionsPerIp": 2147483647,
    "maxConnectionsPerIpOverrides": (),
    "tlsHandshakeTimeoutMs": 10000,
    "proxyProtocolTrustedAddresses": (),
    "saslServerMaxReceiveSize": 524288,
    "maxUnauthenticatedBufferedBytes": 67108864,
    "maxConcurrentLogins": 8,
    "authorizationEnabled": False,
    "superUserRoles": (),
    "kopAllowedNamespaces": (),
    "maxAclBindingsPerTenant": 1000,
    "logLevel": "INFO",
    "logFormat": "TEXT",
}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def test_registry_lists_exactly_the_documented_keys() -> None:
    assert list(CONFIG_KEYS) == list(EXPECTED_DEFAULTS)
    for name, key in CONFIG_KEYS.items():
        assert key.name == name
        assert key.attr == _snake(name)
        assert key.doc


def test_defaults() -> None:
    config = load_config(None, [])
    assert config == BrokerConfig()
    for name, expected in EXPECTED_DEFAULTS.items():
        assert getattr(config, CONFIG_KEYS[name].attr) == expected, name
        assert CONFIG_KEYS[name].default == expected


def test_default_listener_specs() -> None:
    (spec,) = BrokerConfig().listener_specs()
    assert (spec.name, spec.protocol, spec.host, spec.port) == (
        "PLAINTEXT",
        SecurityProtocol.PLAINTEXT,
        "127.0.0.1",
        9092,
    )


def test_defaults_round_trip_through_text() -> None:
    for key in CONFIG_KEYS.values():
        assert key.parse(to_text(key.default)) == key.default


def test_to_properties_round_trip() -> None:
    config = load_config(
        None, ["brokerId=7", "allowAutoTopicCreation=false", "logLevel=debug", "dataDir=/x y"]
    )
    again = load_config(None, [f"{k}={v}" for k, v in config.to_properties().items()])
    assert again == config


def test_config_is_frozen() -> None:
    config = BrokerConfig()
    with pytest.raises(ValidationError, match="frozen"):
        config.broker_id = 3  # type: ignore[misc]


# ------------------------------------------------------------------------ valid values


@pytest.mark.parametrize(
    ("override", "attr", "value"),
    [
        ("brokerId=2147483647", "broker_id", 2147483647),
        ("brokerId= +5 ", "broker_id", 5),
        ("brokerId=007", "broker_id", 7),
        ("allowAutoTopicCreation=FALSE", "allow_auto_topic_creation", False),
        ("allowAutoTopicCreation=True", "allow_auto_topic_creation", True),
        ("defaultNumPartitions=12", "default_num_partitions", 12),
        ("flushIntervalMessages=1", "flush_interval_messages", 1),
        ("flushIntervalMs=0", "flush_interval_ms", 0),
        ("logSegmentBytes=1024", "log_segment_bytes", 1024),
        ("logRetentionMs=-1", "log_retention_ms", -1),
        ("logRetentionBytes=1000000", "log_retention_bytes", 1000000),
        ("connectionMaxIdleMs=0", "connection_max_idle_ms", 0),
        ("logLevel=warning", "log_level", "WARNING"),
        ("logLevel= Error ", "log_level", "ERROR"),
        ("kafkaTenant=my-tenant_1", "kafka_tenant", "my-tenant_1"),
        ("dataDir=/var/lib/edge", "data_dir", "/var/lib/edge"),
        ("kafkaAdvertisedListeners=PLAINTEXT://a:1", "kafka_advertised_listeners",
         "PLAINTEXT://a:1"),
    ],
)
def test_valid_values(override: str, attr: str, value: object) -> None:
    assert getattr(load_config(None, [override]), attr) == value


# ---------------------------------------------------------------------- invalid values

INVALID = [
    ("brokerSessionTimeoutMs", "499"),
    ("brokerHeartbeatIntervalMs", "49"),
    ("brokerId", "abc"),
    ("brokerId", "-1"),
    ("brokerId", "2147483648"),
    ("brokerId", "1.0"),
    ("brokerId", "0x10"),
    ("brokerId", "1_000"),
    ("brokerId", "1 2"),
    ("brokerId", "\u0661"),  # an Arabic-Indic digit: int() would take it
    ("brokerId", ""),
    ("kafkaListeners", ""),
    ("kafkaTenant", ""),
    ("kafkaTenant", "a/b"),
    ("kafkaTenant", ".."),
    ("kafkaTenant", "t" * 65),
    ("kafkaNamespace", "n" * 65),
    ("kafkaNamespace", "a=b"),
    ("kafkaNamespace", "has space"),
    ("eventLoopSliceUs", "-1"),
    ("eventLoopSliceUs", "100001"),
    ("allowAutoTopicCreation", "yes"),
    ("allowAutoTopicCreation", "1"),
    ("allowAutoTopicCreation", ""),
    ("defaultNumPartitions", "0"),
    ("dataDir", ""),
    ("storageUrl", "mysql://db/kafka"),
    ("storageUrl", "s3://bucket"),
    ("maxFrameBytes", "0"),
    ("maxFrameBytes", "2147483648"),
    ("flushIntervalMessages", "0"),
    ("flushIntervalMessages", "9223372036854775808"),
    ("flushIntervalMs", "-1"),
    ("logSegmentBytes", "1023"),
    ("logSegmentMs", "0"),
    ("logRetentionMs", "-2"),
    ("logRetentionBytes", "-2"),
    ("logRetentionCheckIntervalMs", "0"),
    ("logCleanerEnable", "maybe"),
    ("logCleanerBackoffMs", "0"),
    ("logCleanerIoMaxBytesPerSecond", "-1"),
    ("logCleanerDedupeBufferSize", "0"),
    ("maxQueuedRequests", "0"),
    ("maxPendingResponseBytes", "0"),
    ("fetchMaxBytes", "0"),
    ("connectionMaxIdleMs", "-1"),
    ("kafkaMetadataTenant", "a/b"),
    ("kafkaMetadataNamespace", ""),
    ("kafkaEnableMultiTenantMetadata", "yes"),
    ("groupMinSessionTimeoutMs", "0"),
    ("groupMaxSessionTimeoutMs", "0"),
    ("groupInitialRebalanceDelayMs", "-1"),
    ("groupIdMaxLength", "0"),
    ("groupMaxSize", "0"),
    ("groupMetadataMaxBytes", "1023"),
    ("offsetsTopicNumPartitions", "0"),
    ("offsetsTopicSegmentBytes", "10"),
    ("offsetsTopicCompactionBytes", "10"),
    ("offsetMetadataMaxSize", "-1"),
    ("offsetsRetentionMinutes", "0"),
    ("offsetsRetentionCheckIntervalMs", "0"),
    ("kafkaTransactionCoordinatorEnabled", "yes"),
    ("kafkaTxnLogTopicNumPartitions", "0"),
    ("transactionMaxTimeoutMs", "0"),
    ("transactionalIdExpirationMs", "0"),
    ("producerIdExpirationMs", "0"),
    ("validateRecords", "maybe"),
    ("producerIdExpirationCheckIntervalMs", "2147483648"),
    ("transactionAbortTimedOutTransactionsIntervalMs", "0"),
    ("auditEnabled", "sometimes"),
    ("auditDenialsPerWindow", "0"),
    ("auditDenialWindowMs", "99"),
    ("defaultTenantProducerByteRate", "-1"),
    ("defaultTenantConsumerByteRate", "1.5"),
    ("defaultTenantRequestPercentage", "-5"),
    ("defaultTenantConnectionCreationRate", "-1"),
    ("defaultTenantControllerMutationRate", "-1"),
    ("defaultTenantMaxConnections", "x"),
    ("defaultTenantMaxTopics", "-2"),
    ("defaultTenantMaxPartitions", "1.5"),
    ("defaultTenantMaxStoredBytes", "-1"),
    ("maxQuotaEntitiesPerTenant", "0"),
    ("tenantUsageCheckIntervalMs", "99"),
    ("quotaWindowNum", "1"),
    ("quotaWindowSizeSeconds", "0"),
    ("metricsPort", "65536"),
    ("metricsHost", ""),
    ("tokenAuthClaim", ""),
    ("tokenExpiration", "sometimes"),
    ("tokenMaxLifetimeSeconds", "-1"),
    ("failedAuthenticationDelayMs", "-1"),
    ("connectionsMaxReauthMs", "-1"),
    ("tlsRequireTrustedClientCertOnConnect", "maybe"),
    ("tlsPrincipal", "SAN"),
    ("maxConnectionsPerListener", "0"),
    ("maxConnectionsPerIp", "-1"),
    ("auditRejectionsPerWindow", "0"),
    ("auditLoginFailuresPerWindow", "0"),
    ("tlsHandshakeTimeoutMs", "99"),
    ("saslServerMaxReceiveSize", "0"),
    ("maxUnauthenticatedBufferedBytes", "-1"),
    ("maxConcurrentLogins", "0"),
    ("authorizationEnabled", "2"),
    ("maxAclBindingsPerTenant", "0"),
    ("logLevel", "TRACE"),
    ("logLevel", "CRITICAL"),
    ("compressionType", "brotli"),
    ("compressionType", "GZIP"),  # Kafka's values are lower case
    ("compressionType", "none"),  # the producer's word; the topic's is 'uncompressed'
    ("logFormat", "xml"),
]


def test_every_key_has_an_invalid_case() -> None:
    covered = {name for name, _ in INVALID} | {
        "kafkaAdvertisedListeners",  # covered by the listener cases below
        "kafkaProtocolMap",
        # free text, checked when the broker starts (tests/test_security_config.py)
        "saslAllowedMechanisms", "saslListenerMechanisms", "tokenSecretKey",
        "tokenPublicKey", "tokenAudienceClaim", "tokenAudience", "kopOauth2ConfigFile",
        "tlsCertificateFilePath",
        "tlsKeyFilePath", "tlsTrustCertsFilePath", "superUserRoles", "kopAllowedNamespaces",
        "brokerRack",  # any text names a rack
        # its entries are checked across keys (tests/security/test_security_listeners.py)
        "maxConnectionsPerIpOverrides",
        # checked across keys (tests/security/test_proxy_protocol_listeners.py)
        "proxyProtocolTrustedAddresses",
    }
    assert covered == set(CONFIG_KEYS)


@pytest.mark.parametrize(("name", "value"), INVALID)
def test_invalid_value_names_key_value_and_expectation(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"{name}={value}"])
    message = str(info.value)
    assert message.startswith(f"invalid value {value!r} for {name!r}: expected ")
    assert CONFIG_KEYS[name].expected() in message


def test_broker_id_message() -> None:
    with pytest.raises(ConfigError, match=r"^invalid value 'abc' for 'brokerId': expected an "
                       r"integer >= 0"):
        load_config(None, ["brokerId=abc"])


def test_boolean_message() -> None:
    with pytest.raises(ConfigError, match="expected true or false"):
        load_config(None, ["allowAutoTopicCreation=on"])


def test_log_level_message_lists_choices() -> None:
    with pytest.raises(ConfigError, match="DEBUG, INFO, WARNING, ERROR"):
        load_config(None, ["logLevel=loud"])


@pytest.mark.parametrize(
    ("overrides", "key", "fragment"),
    [
        (["kafkaListeners=FOO://h:1"], "kafkaListeners", "not a security protocol"),
        (["kafkaListeners=PLAINTEXT://h:1,PLAINTEXT://h:2"], "kafkaListeners", "duplicate"),
        (["kafkaListeners=PLAINTEXT://h"], "kafkaListeners", ":port"),
        (["kafkaListeners=A://h:1"], "kafkaListeners", "not a security protocol"),
        (
            ["kafkaListeners=A://h:1", "kafkaProtocolMap=B:SSL"],
            "kafkaListeners",
            "not in the protocol map",
        ),
        (
            ["kafkaListeners=A://h:1", "kafkaProtocolMap=A:TLS"],
            "kafkaProtocolMap",
            "unknown security protocol 'TLS'",
        ),
        (["kafkaProtocolMap=garbage"], "kafkaProtocolMap", "NAME:PROTOCOL"),
        (["kafkaAdvertisedListeners=SSL://x:1"], "kafkaAdvertisedListeners", "no listener"),
        (["kafkaAdvertisedListeners=PLAINTEXT://:1"], "kafkaAdvertisedListeners", "host"),
    ],
)
def test_listener_mistakes_stop_loading(overrides: list[str], key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    message = str(info.value)
    assert f"for {key!r}:" in message
    assert fragment in message


@pytest.mark.parametrize("advertised", [
    "EXTERNAL://0.0.0.0:9093", "EXTERNAL://[::]:9093", "EXTERNAL://[0:0:0:0:0:0:0:0]:9093",
    "EXTERNAL://:9093",
])
def test_a_wildcard_advertised_listener_stops_loading(advertised: str) -> None:
    # it was advertised as it was, and every client was sent to itself
    with pytest.raises(ConfigError) as info:
        load_config(None, ["kafkaListeners=INTERNAL://127.0.0.1:9092,EXTERNAL://0.0.0.0:9093",
                           "kafkaProtocolMap=INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL",
                           f"kafkaAdvertisedListeners={advertised}"])
    message = str(info.value)
    assert message.startswith(f"invalid value {advertised!r} for 'kafkaAdvertisedListeners':"
                              f" listener {advertised!r}: "), message
    assert "clients cannot connect to" in message
    assert "give a host name or IP address that clients can reach" in message


def test_a_wildcard_listener_advertises_the_host_name() -> None:
    config = load_config(None, ["kafkaListeners=INTERNAL://127.0.0.1:9092,EXTERNAL://[::]:9093",
                                "kafkaProtocolMap=INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL"])
    internal, external = config.listener_specs()
    assert internal.advertised_address == "127.0.0.1:9092"
    assert external.host == "::"
    assert external.advertised_address == f"{machine_host_name()}:9093"


def test_listener_specs_from_config() -> None:
    config = load_config(
        None,
        [
            "kafkaListeners=INTERNAL://127.0.0.1:0, EXTERNAL://[::1]:9093",
            "kafkaProtocolMap=INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL",
            "kafkaAdvertisedListeners=EXTERNAL://kafka.example:443",
        ],
    )
    internal, external = config.listener_specs()
    assert (internal.name, internal.protocol, internal.port) == (
        "INTERNAL",
        SecurityProtocol.PLAINTEXT,
        0,
    )
    assert internal.advertised_defaulted
    assert (external.host, external.advertised_address) == ("::1", "kafka.example:443")
    # the list is a copy: callers cannot change the config through it
    config.listener_specs().clear()
    assert len(config.listener_specs()) == 2


# ---------------------------------------------------------------- direct construction


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"broker_id": -1}, "brokerId"),
        ({"broker_id": True}, "brokerId"),
        ({"broker_id": "1"}, "brokerId"),
        ({"allow_auto_topic_creation": 1}, "allowAutoTopicCreation"),
        ({"log_level": "info"}, "logLevel"),
        ({"data_dir": ""}, "dataDir"),
        ({"storage_url": "nope://x"}, "storageUrl"),
        ({"kafka_listeners": "nope"}, "kafkaListeners"),
    ],
)
def test_direct_construction_is_validated(changes: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=f"for {key!r}"):
        BrokerConfig(**changes)


def test_replace_revalidates_and_reparses_listeners() -> None:
    config = BrokerConfig().replace(kafka_listeners="SSL://h:1")
    assert [s.name for s in config.listener_specs()] == ["SSL"]
    with pytest.raises(ConfigError, match="maxQueuedRequests"):
        config.replace(max_queued_requests=0)


# ------------------------------------------------------------------- files, overrides


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "broker.properties"
    path.write_text(text, encoding="utf-8")
    return path


def test_load_file(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "# edge broker\n"
        "brokerId = 3\n"
        "kafkaListeners: PLAINTEXT://127.0.0.1:9092,\\\n"
        "                SSL://127.0.0.1:9093\n"
        "allowAutoTopicCreation false\n"
        "! retention\n"
        "logRetentionMs=-1\n"
        "dataDir=/srv/edge\\u0020data\n",
    )
    config = load_config(str(path), [])
    assert config.broker_id == 3
    assert [s.name for s in config.listener_specs()] == ["PLAINTEXT", "SSL"]
    assert config.allow_auto_topic_creation is False
    assert config.log_retention_ms == -1
    assert config.data_dir == "/srv/edge data"
    assert config.log_level == "INFO"


def test_load_file_accepts_path_objects(tmp_path: Path) -> None:
    assert load_config(_write(tmp_path, "brokerId=4\n"), []).broker_id == 4


def test_overrides_win_over_file_and_later_overrides_win(tmp_path: Path) -> None:
    path = _write(tmp_path, "brokerId=1\nlogLevel=ERROR\n")
    config = load_config(str(path), ["brokerId=2", "brokerId=5"])
    assert config.broker_id == 5
    assert config.log_level == "ERROR"


def test_the_config_knows_which_keys_were_set(tmp_path: Path) -> None:
    """A key named in the file or an override is explicit, even at its default value."""
    path = _write(tmp_path, "brokerId=0\nlogLevel=ERROR\n")
    config = load_config(str(path), [" tokenExpiration = REQUIRED"])
    assert config.explicit_keys == {"brokerId", "logLevel", "tokenExpiration"}
    assert config == load_config(None, ["logLevel=ERROR"])
    assert load_config(None, []).explicit_keys == frozenset()


def test_override_can_repair_a_file_value(tmp_path: Path) -> None:
    path = _write(tmp_path, "kafkaListeners=PLAINTEXT://h:1\nkafkaAdvertisedListeners=SSL://x:1\n")
    config = load_config(str(path), ["kafkaAdvertisedListeners="])
    assert config.kafka_advertised_listeners == ""


def test_override_value_may_contain_equals_and_whitespace_around_key() -> None:
    config = load_config(None, [" dataDir = /a=b "])
    assert config.data_dir == "/a=b"


@pytest.mark.parametrize("override", ["brokerId", "=5", " =5", ""])
def test_malformed_override_names_itself(override: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"malformed override {override!r}")):
        load_config(None, [override])


def test_unknown_key_in_override() -> None:
    with pytest.raises(ConfigError, match=r"^unknown config key 'kafkaListener'$"):
        load_config(None, ["kafkaListener=PLAINTEXT://h:1"])


def test_keys_are_case_sensitive() -> None:
    with pytest.raises(ConfigError, match="unknown config key 'brokerid'"):
        load_config(None, ["brokerid=1"])


def test_unknown_key_in_file_names_file_and_key(tmp_path: Path) -> None:
    path = _write(tmp_path, "brokerId=1\nkafkaListener=PLAINTEXT://h:1\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path), [])
    assert str(path) in str(info.value)
    assert "unknown config key 'kafkaListener'" in str(info.value)


def test_invalid_value_in_file_names_file_and_key(tmp_path: Path) -> None:
    path = _write(tmp_path, "brokerId=abc\n")
    with pytest.raises(ConfigError, match="invalid value 'abc' for 'brokerId'") as info:
        load_config(str(path), [])
    assert str(path) in str(info.value)


def test_malformed_escape_in_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "dataDir=\\u00\n")
    with pytest.raises(ConfigError, match="line 1: malformed"):
        load_config(str(path), [])


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.properties"
    with pytest.raises(ConfigError, match="cannot read config file") as info:
        load_config(str(missing), [])
    assert str(missing) in str(info.value)


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


# ------------------------------------------------------------------------ reference doc


def test_config_reference_markdown() -> None:
    doc = config_reference_markdown()
    lines = doc.strip().splitlines()
    assert lines[0].startswith("| key |")
    assert len(lines) == 2 + len(CONFIG_KEYS)
    for name, key in CONFIG_KEYS.items():
        (row,) = [line for line in lines if line.startswith(f"| `{name}` |")]
        assert key.expected() in row
        assert key.doc in row
    assert "`9223372036854775807`" in doc
    assert '| `kafkaAdvertisedListeners` | a string | `""` |' in doc


@pytest.mark.parametrize(("overrides", "key", "stated"), [
    (["brokerSessionTimeoutMs=2000", "brokerHeartbeatIntervalMs=1001"],
     "brokerHeartbeatIntervalMs", "at most half of `brokerSessionTimeoutMs`"),
    (["maxConnectionsPerIp=0"], "maxConnectionsPerIp", "0 without overrides stops the start"),
])
def test_key_docs_state_the_rules_across_keys_that_stop_a_start(
        overrides: list[str], key: str, stated: str) -> None:
    """A value the check across keys refuses is one the key's documentation (the README's
    table) warns of."""
    with pytest.raises(ConfigError, match=key):
        load_config(None, overrides)
    assert stated in CONFIG_KEYS[key].doc


@pytest.mark.parametrize("overrides", [
    ["kafkaNamespace=__kafka"],
    ["kafkaMetadataNamespace=default"],
    ["kafkaTenant=sys", "kafkaNamespace=meta", "kafkaMetadataTenant=sys",
     "kafkaMetadataNamespace=meta"],
    ["kafkaNamespace=shared", "kafkaMetadataNamespace=shared",
     "kafkaEnableMultiTenantMetadata=false"],
])
def test_short_names_may_not_resolve_into_the_system_namespace(overrides: list[str]) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(None, overrides)
    assert "'kafkaNamespace'" in str(refused.value)
    assert "'kafkaMetadataNamespace'" in str(refused.value)


def test_the_same_tenant_with_another_namespace_is_fine() -> None:
    config = load_config(None, ["kafkaMetadataTenant=public", "kafkaNamespace=apps"])
    assert (config.kafka_tenant, config.kafka_namespace) == ("public", "apps")
    assert config.kafka_metadata_namespace == "__kafka"


def test_storage_url_defaults_to_the_absolute_data_dir(tmp_path: Path) -> None:
    config = BrokerConfig(data_dir=str(tmp_path / "d"))
    assert config.effective_storage_url() == (tmp_path / "d").resolve().as_uri()
    assert BrokerConfig(storage_url="memory://").effective_storage_url() == "memory://"


def test_a_refused_storage_url_does_not_show_its_password() -> None:
    for url in ("postgress://edge:s3cret@db:5432/kafka", "mysql://edge:s3cret@db:x/kafka"):
        with pytest.raises(ConfigError) as refused:
            load_config(None, [f"storageUrl={url}"])
        assert "s3cret" not in str(refused.value)
        assert "storageUrl" in str(refused.value)


def test_a_heartbeat_must_fit_twice_in_a_broker_session() -> None:
    with pytest.raises(ConfigError, match="brokerHeartbeatIntervalMs"):
        load_config(None, ["brokerSessionTimeoutMs=1000", "brokerHeartbeatIntervalMs=600"])
    config = load_config(None, ["brokerSessionTimeoutMs=1000", "brokerHeartbeatIntervalMs=500"])
    assert config.broker_heartbeat_interval_ms == 500


# ------------------------------------------------------------------- lists, secrets


def test_list_keys_are_parsed_at_load() -> None:
    config = load_config(None, ["superUserRoles= admin, ,ops ", "saslAllowedMechanisms=PLAIN,"
                                "OAUTHBEARER", "kopAllowedNamespaces="])
    assert config.super_user_roles == ("admin", "ops")
    assert config.sasl_allowed_mechanisms == ("PLAIN", "OAUTHBEARER")
    assert config.kop_allowed_namespaces == ()
    assert config.to_properties()["superUserRoles"] == "admin,ops"


def test_a_password_in_a_bad_storage_url_is_not_shown() -> None:
    with pytest.raises(ConfigError, match="for 'storageUrl'") as info:
        load_config(None, ["storageUrl=mysql://edge:hunter2@db/kafka"])
    assert "hunter2" not in str(info.value)
    with pytest.raises(ConfigError, match="for 'storageUrl'") as info:
        BrokerConfig(storage_url="mysql://edge:hunter2@db/kafka")
    assert "hunter2" not in str(info.value)
