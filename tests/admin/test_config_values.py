"""Topic config values as the broker reads them: a value stored before values were kept
canonical (a number with thousands of leading zeros) is read by the one parser wherever a
topic's settings are derived (produce rules, the log cleaner's settings)."""

from __future__ import annotations

from broker_core.compaction.cleaning import CompactionSettings
from broker_core.engine_config import ProduceRules
from broker_core.topic_configs import effective_config, validate_topic_configs

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
    assert validate_topic_configs({
        "retention.ms": " -" + ZEROS + "1 ", "segment.bytes": ZEROS + "4096",
        "cleanup.policy": "compact, delete,compact", "min.cleanable.dirty.ratio": " 0.25 ",
        "compression.type": "gzip"}) == {
        "retention.ms": "-1", "segment.bytes": "4096", "cleanup.policy": "compact,delete",
        "min.cleanable.dirty.ratio": "0.25", "compression.type": "gzip"}
