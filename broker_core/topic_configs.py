"""Topic-level configs: which keys a topic accepts, their defaults and how values are checked."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from broker_core.codecs import CODEC_BY_NAME, PRODUCER
from broker_core.errors import ErrorCode, KafkaApiError

COMPRESSION_TYPES = (*CODEC_BY_NAME, PRODUCER)
"""The values of ``compression.type``, for topics and the broker default."""


def list_items(value: str) -> list[str]:
    """The items of a list-valued config (comma-separated, blanks dropped)."""
    return [item.strip() for item in value.split(",") if item.strip()]


def _int_at_least(low: int) -> Callable[[str], bool]:
    def check(value: str) -> bool:
        try:
            return int(value) >= low
        except ValueError:
            return False

    return check


def _one_of(*choices: str) -> Callable[[str], bool]:
    return lambda value: value in choices


@dataclass(frozen=True, slots=True)
class TopicConfigKey:
    """One topic config key: its default value, its check and what it is for."""

    name: str
    default: str
    check: Callable[[str], bool]
    expected: str
    doc: str


_KEYS = (
    TopicConfigKey("cleanup.policy", "delete", _one_of("delete"), "'delete'",
                   "How old data goes: whole ledgers are deleted by retention."),
    TopicConfigKey("retention.ms", "604800000", _int_at_least(-1), "an integer >= -1",
                   "Ledgers older than this are deleted (-1 keeps them forever)."),
    TopicConfigKey("retention.bytes", "-1", _int_at_least(-1), "an integer >= -1",
                   "Oldest ledgers are deleted while a partition is larger than this."),
    TopicConfigKey("segment.bytes", "1073741824", _int_at_least(1024), "an integer >= 1024",
                   "A new ledger is started when the open one reaches this size."),
    TopicConfigKey("segment.ms", "604800000", _int_at_least(1), "an integer >= 1",
                   "A new ledger is started when the open one is this old."),
    TopicConfigKey("index.interval.bytes", "4096", _int_at_least(0), "an integer >= 0",
                   "Bytes between two entries of the sparse offset index."),
    TopicConfigKey("max.message.bytes", "1048588", _int_at_least(0), "an integer >= 0",
                   "Largest record batch a producer may send."),
    TopicConfigKey("message.timestamp.type", "CreateTime",
                   _one_of("CreateTime", "LogAppendTime"), "'CreateTime' or 'LogAppendTime'",
                   "Keep the producer's timestamps, or stamp batches with the broker's time."),
    TopicConfigKey("min.insync.replicas", "1", _int_at_least(1), "an integer >= 1",
                   "acks=all produce fails with NOT_ENOUGH_REPLICAS above 1 (one replica)."),
    TopicConfigKey("compression.type", PRODUCER, _one_of(*COMPRESSION_TYPES),
                   " or ".join(f"'{name}'" for name in COMPRESSION_TYPES),
                   "The codec batches are stored in: 'gzip', 'snappy', 'lz4' or 'zstd', "
                   "'uncompressed', or 'producer' to keep the producer's. A batch in "
                   "another codec is compressed again on its way in."),
)

# Config sources as DescribeConfigs and CreateTopics report them.
DYNAMIC_TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5

TOPIC_CONFIG_KEYS: Mapping[str, TopicConfigKey] = {key.name: key for key in _KEYS}


def config_source(name: str, own: Collection[str], configured: Collection[str]) -> int:
    """Where a topic's value of ``name`` comes from: the topic's ``own`` configs, else the
    broker's config when it sets that default (``configured``), else the default."""
    if name in own:
        return DYNAMIC_TOPIC_CONFIG
    return STATIC_BROKER_CONFIG if name in configured else DEFAULT_CONFIG


def validate_topic_configs(configs: Mapping[str, str | None]) -> dict[str, str]:
    """Check configs given to CreateTopics or AlterConfigs; return them without null values."""
    checked: dict[str, str] = {}
    for name, value in configs.items():
        key = TOPIC_CONFIG_KEYS.get(name)
        if key is None:
            raise KafkaApiError(ErrorCode.INVALID_CONFIG, f"unknown topic config {name!r}")
        if value is None:
            continue
        if not key.check(value):
            raise KafkaApiError(
                ErrorCode.INVALID_CONFIG,
                f"invalid value {value!r} for topic config {name!r}: expected {key.expected}",
            )
        checked[name] = value
    return checked


def effective_config(configs: Mapping[str, str], defaults: Mapping[str, str]) -> dict[str, str]:
    """Every topic config key with its value: the topic's own, else the broker default."""
    return {
        name: configs.get(name, defaults.get(name, key.default))
        for name, key in TOPIC_CONFIG_KEYS.items()
    }
