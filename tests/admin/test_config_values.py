"""Topic config values as the broker takes and reads them: kept canonical, at most 1 KiB
long (INVALID_CONFIG beyond, the message without the value); a value stored before values
were kept canonical (a number with thousands of leading zeros) is read by the one parser
wherever a topic's settings are derived (produce rules, the log cleaner's settings)."""

from __future__ import annotations

import pytest

from broker_core.compaction.cleaning import CompactionSettings
from broker_core.engine_config import ProduceRules
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.topic_configs import MAX_VALUE_CHARS, effective_config, validate_topic_configs

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
