"""Topic-level configs: which keys a topic accepts, their defaults, how values are checked
(Kafka's types and ranges; a value out of them is INVALID_CONFIG), what type
DescribeConfigs gives them and the name of the broker config that sets their default in
Kafka (what DescribeConfigs shows for a broker)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from broker_core.codec.compression import CODEC_BY_NAME, PRODUCER
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.storage.config import whole_number

COMPRESSION_TYPES = (*CODEC_BY_NAME, PRODUCER)
"""The values of ``compression.type``, for topics and the broker default."""
CLEANUP_POLICIES = ("delete", "compact")
"""The items ``cleanup.policy`` may list."""
INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1
MAX_VALUE_CHARS = 1024
"""The longest topic config value taken (INVALID_CONFIG beyond): Kafka bounds a value
only by its request's size, but none of the keys here needs more (the one list,
``cleanup.policy``, has two items), and a tenant must not store megabytes in the topic
metadata every broker holds, nor make each alter parse them."""

# Config types as DescribeConfigs (v3+) reports them.
TYPE_STRING, TYPE_INT, TYPE_LONG, TYPE_DOUBLE, TYPE_LIST = 2, 3, 5, 6, 7

_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
"""Unambiguous (each digit can match one way only), so a failing match is linear."""


def list_items(value: str) -> list[str]:
    """The items of a list-valued config (comma-separated, blanks dropped)."""
    return [item.strip() for item in value.split(",") if item.strip()]


def _integer(low: int, high: int) -> Callable[[str], bool]:
    def check(value: str) -> bool:
        try:
            return low <= whole_number(value) <= high
        except ValueError:
            return False

    return check


def _fraction(value: str) -> bool:
    text = value.strip()
    if not _DECIMAL.fullmatch(text):
        return False
    number = float(text)
    return math.isfinite(number) and 0.0 <= number <= 1.0


def _one_of(*choices: str) -> Callable[[str], bool]:
    return lambda value: value in choices


def _policy(value: str) -> bool:
    items = list_items(value)
    return bool(items) and all(item in CLEANUP_POLICIES for item in items)


@dataclass(frozen=True, slots=True)
class TopicConfigKey:
    """One topic config key: its default value, its check and what it is for."""

    name: str
    default: str
    check: Callable[[str], bool]
    expected: str
    doc: str
    kind: int
    """Its type in DescribeConfigs."""
    server: str
    """Kafka's broker config that sets its default."""
    canonical: Callable[[str], str] = str
    """The value as stored once its check passed (a number as its digits, without the
    leading zeros Kafka's parser accepts and Python's ``int`` refuses beyond 4,300
    digits), as Kafka's DescribeConfigs gives it back."""


def _whole(value: str) -> str:
    return str(whole_number(value))


def _long(name: str, default: str, low: int, doc: str, server: str) -> TopicConfigKey:
    return TopicConfigKey(name, default, _integer(low, LONG_MAX), f"an integer >= {low}", doc,
                          TYPE_LONG, server, _whole)


def _int(name: str, default: str, low: int, doc: str, server: str) -> TopicConfigKey:
    return TopicConfigKey(name, default, _integer(low, INT_MAX),
                          f"an integer >= {low} and <= {INT_MAX}", doc, TYPE_INT, server,
                          _whole)


def config_number(configs: Mapping[str, str], name: str) -> int:
    """An integer config's value (``whole_number``: a value stored before values were
    kept canonical may still carry any number of leading zeros)."""
    return whole_number(configs[name])


_KEYS = (
    TopicConfigKey("cleanup.policy", "delete", _policy,
                   "'delete', 'compact' or both, comma-separated",
                   "delete: retention deletes whole ledgers. compact: records must carry a key"
                   " (INVALID_RECORD otherwise), retention deletes nothing and the log "
                   "cleaner keeps only the latest record of each key. "
                   "compact,delete: both.", TYPE_LIST, "log.cleanup.policy",
                   lambda value: ",".join(dict.fromkeys(list_items(value)))),
    _long("retention.ms", "604800000", -1,
          "Ledgers older than this are deleted (-1 keeps them forever).", "log.retention.ms"),
    _long("retention.bytes", "-1", -1,
          "Oldest ledgers are deleted while a partition is larger than this.",
          "log.retention.bytes"),
    _int("segment.bytes", "1073741824", 1024,
         "A new ledger is started when the open one reaches this size.", "log.segment.bytes"),
    _long("segment.ms", "604800000", 1,
          "A new ledger is started when the open one is this old.", "log.roll.ms"),
    _int("index.interval.bytes", "4096", 0,
         "Bytes between two entries of the sparse offset index.", "log.index.interval.bytes"),
    _int("max.message.bytes", "1048588", 0,
         "Largest record batch a producer may send.", "message.max.bytes"),
    TopicConfigKey("message.timestamp.type", "CreateTime",
                   _one_of("CreateTime", "LogAppendTime"), "'CreateTime' or 'LogAppendTime'",
                   "Keep the producer's timestamps, or stamp batches with the broker's time.",
                   TYPE_STRING, "log.message.timestamp.type"),
    _int("min.insync.replicas", "1", 1,
         "acks=all produce fails with NOT_ENOUGH_REPLICAS above 1 (one replica).",
         "min.insync.replicas"),
    TopicConfigKey("compression.type", PRODUCER, _one_of(*COMPRESSION_TYPES),
                   " or ".join(f"'{name}'" for name in COMPRESSION_TYPES),
                   "The codec batches are stored in: 'gzip', 'snappy', 'lz4' or 'zstd', "
                   "'uncompressed', or 'producer' to keep the producer's. A batch in "
                   "another codec is compressed again on its way in.", TYPE_STRING,
                   "compression.type"),
    TopicConfigKey("min.cleanable.dirty.ratio", "0.5", _fraction, "a number from 0 to 1",
                   "The share of a compacted partition not yet cleaned above which the "
                   "cleaner takes it.", TYPE_DOUBLE, "log.cleaner.min.cleanable.ratio",
                   str.strip),
    _long("min.compaction.lag.ms", "0", 0,
          "A record stays uncompacted at least this long.",
          "log.cleaner.min.compaction.lag.ms"),
    _long("max.compaction.lag.ms", str(LONG_MAX), 1,
          "A record is eligible for compaction at most this long after it was written.",
          "log.cleaner.max.compaction.lag.ms"),
    _long("delete.retention.ms", "86400000", 0,
          "How long a tombstone (a record with a key and no value) of a compacted topic is "
          "kept once cleaned.", "log.cleaner.delete.retention.ms"),
)

# Config sources as DescribeConfigs and CreateTopics report them.
DYNAMIC_TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5

TOPIC_CONFIG_KEYS: Mapping[str, TopicConfigKey] = {key.name: key for key in _KEYS}
BROKER_SYNONYMS: Mapping[str, TopicConfigKey] = {key.server: key for key in _KEYS}
"""Topic config keys by the name of the Kafka broker config that sets their default."""


def config_source(name: str, own: Collection[str], configured: Collection[str]) -> int:
    """Where a topic's value of ``name`` comes from: the topic's ``own`` configs, else the
    broker's config when it sets that default (``configured``), else the default."""
    if name in own:
        return DYNAMIC_TOPIC_CONFIG
    return STATIC_BROKER_CONFIG if name in configured else DEFAULT_CONFIG


def _check_across(checked: Mapping[str, str]) -> None:
    """Kafka's checks between keys, on a topic's whole set of configs."""
    def value(name: str) -> int:
        return whole_number(checked.get(name, TOPIC_CONFIG_KEYS[name].default))

    low, high = value("min.compaction.lag.ms"), value("max.compaction.lag.ms")
    if low > high:
        raise KafkaApiError(ErrorCode.INVALID_CONFIG,
                            f"conflicting topic configs: min.compaction.lag.ms {low} > "
                            f"max.compaction.lag.ms {high}")


def check_value_length(name: str, value: str) -> None:
    """INVALID_CONFIG for a value longer than :data:`MAX_VALUE_CHARS` (checked before
    anything reads it; the message does not repeat it)."""
    if len(value) > MAX_VALUE_CHARS:
        raise KafkaApiError(ErrorCode.INVALID_CONFIG,
                            f"the value of topic config {name[:100]!r} is {len(value)} "
                            f"characters long; at most {MAX_VALUE_CHARS} are taken")


def validate_topic_configs(configs: Mapping[str, str | None]) -> dict[str, str]:
    """Check a topic's configs given to CreateTopics or AlterConfigs (its whole set);
    return them without null values, each in its canonical form."""
    checked: dict[str, str] = {}
    for name, value in configs.items():
        key = TOPIC_CONFIG_KEYS.get(name)
        if key is None:
            raise KafkaApiError(ErrorCode.INVALID_CONFIG,
                                f"unknown topic config {name[:100]!r}")
        if value is None:
            continue
        check_value_length(name, value)
        if not key.check(value):
            raise KafkaApiError(
                ErrorCode.INVALID_CONFIG,
                f"invalid value {value!r} for topic config {name!r}: expected {key.expected}",
            )
        checked[name] = key.canonical(value)
    _check_across(checked)
    return checked


def effective_config(configs: Mapping[str, str], defaults: Mapping[str, str]) -> dict[str, str]:
    """Every topic config key with its value: the topic's own, else the broker default."""
    return {
        name: configs.get(name, defaults.get(name, key.default))
        for name, key in TOPIC_CONFIG_KEYS.items()
    }
