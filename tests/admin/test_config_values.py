"""Topic config values as the broker takes and reads them: kept canonical, at most 1 KiB
long (INVALID_CONFIG beyond, the message without the value); a value stored before values
were kept canonical (a number with thousands of leading zeros) is read by the one parser
wherever a topic's settings are derived (produce rules, the log cleaner's settings). Every
key of Kafka's TopicConfig is taken, with Kafka's type, default, range and broker synonym;
the timestamp bounds of produce (KIP-937) as the batch header gives them."""

from __future__ import annotations

import dataclasses

import pytest

from broker_core.codec.batch_header import BatchHeader
from broker_core.compaction.cleaning import CompactionSettings
from broker_core.engine_config import ProduceRules
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.produce_timestamps import TimestampBounds
from broker_core.topic_configs import (
    BROKER_SYNONYMS,
    MAX_VALUE_CHARS,
    TOPIC_CONFIG_KEYS,
    TYPE_BOOLEAN,
    TYPE_DOUBLE,
    TYPE_INT,
    TYPE_LIST,
    TYPE_LONG,
    TYPE_STRING,
    effective_config,
    validate_topic_configs,
)
from tests.batches import build_batch
from tests.storage_helpers import headed

ZEROS = "0" * 5_000


def test_stored_numbers_with_leading_zeros_are_read() -> None:
    own = {"max.message.bytes": ZEROS + "2000", "min.insync.replicas": ZEROS + "1",
           "min.compaction.lag.ms": ZEROS, "delete.retention.ms": ZEROS + "5",
           "segment.bytes": ZEROS + "4096", "cleanup.policy": "compact"}
    settings = effective_config(own, {})
    rules = ProduceRules.of("public/default/zeros", own, settings)
    assert (rules.max_message_bytes, rules.min_insync_replicas) == (2000, 1)
    compaction = CompactionSettings.of(settings)
    assert (compaction.min_lag_ms, compaction.delete_retention_ms,
            compaction.segment_bytes) == (0, 5, 4096)


def test_values_are_kept_canonical() -> None:
    zeros = "0" * 1000
    assert validate_topic_configs({
        "retention.ms": " -" + zeros + "1 ", "segment.bytes": zeros + "4096",
        "cleanup.policy": "compact, delete,compact", "min.cleanable.dirty.ratio": " 0.25 ",
        "compression.type": "gzip"}) == {
        "retention.ms": "-1", "segment.bytes": "4096", "cleanup.policy": "compact,delete",
        "min.cleanable.dirty.ratio": "0.25", "compression.type": "gzip"}


@pytest.mark.parametrize(("name", "value"), [
    ("retention.ms", "0" * 30_000_000 + "1"), ("cleanup.policy", "delete," * 4_000_000),
    ("compression.type", "x" * (MAX_VALUE_CHARS + 1))])
def test_a_value_longer_than_1_kib_is_refused_without_being_repeated(
        name: str, value: str) -> None:
    with pytest.raises(KafkaApiError) as refused:
        validate_topic_configs({name: value})
    assert refused.value.code == ErrorCode.INVALID_CONFIG
    assert len(refused.value.message) < 200
    print(refused.value.message)


def test_a_list_value_within_the_limit_is_kept_without_repeats() -> None:
    assert validate_topic_configs({"cleanup.policy": "delete," * 100}) == {
        "cleanup.policy": "delete"}


# -- every key of Kafka's TopicConfig ----------------------------------------------------

KAFKA_TOPIC_CONFIGS = {  # Kafka 3.9's TopicConfig and LogConfig: key -> (type, default)
    "cleanup.policy": (TYPE_LIST, "delete"), "compression.type": (TYPE_STRING, "producer"),
    "compression.gzip.level": (TYPE_INT, "-1"), "compression.lz4.level": (TYPE_INT, "9"),
    "compression.zstd.level": (TYPE_INT, "3"), "delete.retention.ms": (TYPE_LONG, "86400000"),
    "file.delete.delay.ms": (TYPE_LONG, "60000"),
    "flush.messages": (TYPE_LONG, "9223372036854775807"),
    "flush.ms": (TYPE_LONG, "9223372036854775807"),
    "follower.replication.throttled.replicas": (TYPE_LIST, ""),
    "index.interval.bytes": (TYPE_INT, "4096"),
    "leader.replication.throttled.replicas": (TYPE_LIST, ""),
    "local.retention.bytes": (TYPE_LONG, "-2"), "local.retention.ms": (TYPE_LONG, "-2"),
    "max.compaction.lag.ms": (TYPE_LONG, "9223372036854775807"),
    "max.message.bytes": (TYPE_INT, "1048588"),
    "message.downconversion.enable": (TYPE_BOOLEAN, "true"),
    "message.format.version": (TYPE_STRING, "3.0-IV1"),
    "message.timestamp.after.max.ms": (TYPE_LONG, "9223372036854775807"),
    "message.timestamp.before.max.ms": (TYPE_LONG, "9223372036854775807"),
    "message.timestamp.difference.max.ms": (TYPE_LONG, "9223372036854775807"),
    "message.timestamp.type": (TYPE_STRING, "CreateTime"),
    "min.cleanable.dirty.ratio": (TYPE_DOUBLE, "0.5"),
    "min.compaction.lag.ms": (TYPE_LONG, "0"), "min.insync.replicas": (TYPE_INT, "1"),
    "preallocate": (TYPE_BOOLEAN, "false"), "remote.log.copy.disable": (TYPE_BOOLEAN, "false"),
    "remote.log.delete.on.disable": (TYPE_BOOLEAN, "false"),
    "remote.storage.enable": (TYPE_BOOLEAN, "false"),
    "retention.bytes": (TYPE_LONG, "-1"), "retention.ms": (TYPE_LONG, "604800000"),
    "segment.bytes": (TYPE_INT, "1073741824"), "segment.index.bytes": (TYPE_INT, "10485760"),
    "segment.jitter.ms": (TYPE_LONG, "0"), "segment.ms": (TYPE_LONG, "604800000"),
    "unclean.leader.election.enable": (TYPE_BOOLEAN, "false"),
}


def test_every_kafka_topic_config_is_known_with_its_type_and_default() -> None:
    assert {name: (key.kind, key.default) for name, key in TOPIC_CONFIG_KEYS.items()} == \
        KAFKA_TOPIC_CONFIGS
    assert validate_topic_configs(dict(effective_config({}, {}))) == effective_config({}, {})


def test_the_keys_stock_tools_set_are_taken_in_kafkas_forms() -> None:
    assert validate_topic_configs({
        "preallocate": " TRUE ", "unclean.leader.election.enable": "False",
        "leader.replication.throttled.replicas": "0:1, 1:2",
        "follower.replication.throttled.replicas": "*",
        "message.format.version": "2.8.1", "message.downconversion.enable": "true",
        "compression.zstd.level": "-5", "compression.gzip.level": "-1",
        "segment.jitter.ms": "0060000", "segment.index.bytes": "4",
        "file.delete.delay.ms": "0", "local.retention.ms": "-2",
        "remote.storage.enable": "false", "flush.ms": "0", "flush.messages": "1",
        "message.timestamp.before.max.ms": "0", "message.timestamp.after.max.ms": "3600000",
        "message.timestamp.difference.max.ms": "1000"}) == {
        "preallocate": "true", "unclean.leader.election.enable": "false",
        "leader.replication.throttled.replicas": "0:1,1:2",
        "follower.replication.throttled.replicas": "*",
        "message.format.version": "2.8.1", "message.downconversion.enable": "true",
        "compression.zstd.level": "-5", "compression.gzip.level": "-1",
        "segment.jitter.ms": "60000", "segment.index.bytes": "4",
        "file.delete.delay.ms": "0", "local.retention.ms": "-2",
        "remote.storage.enable": "false", "flush.ms": "0", "flush.messages": "1",
        "message.timestamp.before.max.ms": "0", "message.timestamp.after.max.ms": "3600000",
        "message.timestamp.difference.max.ms": "1000"}


@pytest.mark.parametrize(("name", "value"), [
    ("remote.storage.enable", "true"), ("preallocate", "yes"), ("preallocate", ""),
    ("compression.gzip.level", "0"), ("compression.gzip.level", "10"),
    ("compression.lz4.level", "18"), ("compression.zstd.level", "-131073"),
    ("compression.zstd.level", "23"), ("message.format.version", "4.0"),
    ("message.format.version", "0.7"), ("message.format.version", "banana"),
    ("leader.replication.throttled.replicas", "0:1,*"),
    ("follower.replication.throttled.replicas", "a:b"), ("segment.index.bytes", "3"),
    ("segment.jitter.ms", "-1"), ("flush.messages", "0"), ("flush.ms", "-1"),
    ("file.delete.delay.ms", "-1"), ("local.retention.ms", "-3"),
    ("local.retention.bytes", "x"), ("message.timestamp.before.max.ms", "-1"),
    ("message.timestamp.after.max.ms", "9223372036854775808"),
    ("message.timestamp.difference.max.ms", "-1"), ("no.such.config", "1"),
    ("log.retention.ms", "1"),  # a broker name is no topic key
])
def test_values_outside_kafkas_type_or_range_are_invalid_config(name: str, value: str) -> None:
    with pytest.raises(KafkaApiError) as refused:
        validate_topic_configs({name: value})
    assert refused.value.code == ErrorCode.INVALID_CONFIG
    if name == "remote.storage.enable":
        assert "no tiered storage" in refused.value.message


def test_broker_synonyms_are_kafkas() -> None:
    names = {name: key.server for name, key in TOPIC_CONFIG_KEYS.items()}
    assert names["segment.jitter.ms"] == "log.roll.jitter.ms"
    assert names["segment.index.bytes"] == "log.index.size.max.bytes"
    assert names["flush.messages"] == "log.flush.interval.messages"
    assert names["flush.ms"] == "log.flush.interval.ms"
    assert names["file.delete.delay.ms"] == "log.segment.delete.delay.ms"
    assert names["message.timestamp.after.max.ms"] == "log.message.timestamp.after.max.ms"
    assert names["unclean.leader.election.enable"] == "unclean.leader.election.enable"
    assert names["local.retention.ms"] == "log.local.retention.ms"
    assert names["remote.storage.enable"] is None  # Kafka has no broker default for it
    assert BROKER_SYNONYMS["log.preallocate"].name == "preallocate"


# -- the timestamp bounds of produce ----------------------------------------------------

NOW = 1_700_000_000_000


def header_with(base: int, largest: int) -> BatchHeader:
    _batch, header = headed(build_batch([(None, b"v")], timestamp=base))
    return dataclasses.replace(header, base_timestamp=base, max_timestamp=largest)


def bounds(**own: str) -> TimestampBounds | None:
    return TimestampBounds.of(effective_config(own, {}))


def test_no_bounds_by_default_nor_with_log_append_time() -> None:
    assert bounds() is None
    assert bounds(**{"message.timestamp.type": "LogAppendTime",
                     "message.timestamp.before.max.ms": "0"}) is None


@pytest.mark.parametrize(("own", "base", "largest", "refused"), [
    ({"message.timestamp.before.max.ms": "1000"}, NOW - 1000, NOW - 1000, False),
    ({"message.timestamp.before.max.ms": "1000"}, NOW - 1001, NOW, True),
    ({"message.timestamp.before.max.ms": "1000"}, NOW + 10**12, NOW + 10**12, False),
    ({"message.timestamp.after.max.ms": "1000"}, NOW, NOW + 1000, False),
    ({"message.timestamp.after.max.ms": "1000"}, NOW, NOW + 1001, True),
    ({"message.timestamp.after.max.ms": "1000"}, NOW + 1001, NOW, True),  # first, too new
    ({"message.timestamp.after.max.ms": "1000"}, 0, 0, False),
    ({"message.timestamp.difference.max.ms": "1000"}, NOW - 1001, NOW, True),
    ({"message.timestamp.difference.max.ms": "1000"}, NOW, NOW + 1001, True),
    ({"message.timestamp.difference.max.ms": "1000",  # the new key wins on its side
      "message.timestamp.before.max.ms": "5000"}, NOW - 4000, NOW + 500, False),
    ({"message.timestamp.difference.max.ms": "1000",
      "message.timestamp.before.max.ms": "5000"}, NOW, NOW + 1001, True),
    ({"message.timestamp.before.max.ms": "0"}, -1, -1, False),  # no timestamp: unchecked
    ({"message.timestamp.before.max.ms": "0"}, -1, NOW - 1, True),
])
def test_a_batch_out_of_the_bounds_is_invalid_timestamp(
        own: dict[str, str], base: int, largest: int, refused: bool) -> None:
    checked = bounds(**own)
    assert checked is not None
    if not refused:
        checked.check(header_with(base, largest), NOW)
        return
    with pytest.raises(KafkaApiError) as failure:
        checked.check(header_with(base, largest), NOW)
    assert failure.value.code == ErrorCode.INVALID_TIMESTAMP


def test_produce_rules_carry_the_bounds_and_the_flush_policy() -> None:
    own = {"message.timestamp.after.max.ms": "5", "flush.messages": "3", "flush.ms": "7"}
    rules = ProduceRules.of("public/default/t", own, effective_config(own, {}))
    assert rules.timestamps == TimestampBounds(None, 5)
    assert (rules.flush.messages, rules.flush.ms) == (3, 7)
