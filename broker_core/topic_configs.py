"""Topic-level configs: which keys a topic accepts, their defaults, how values are checked
(Kafka's types and ranges; a value out of them is INVALID_CONFIG), what type
DescribeConfigs gives them and the name of the broker config that sets their default in
Kafka (what DescribeConfigs shows for a broker)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from broker_core.codec.compression import CODEC_BY_NAME, PRODUCER
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.storage.config import whole_number
from broker_core.topic_config_checks import (
    boolean,
    canonical_boolean,
    canonical_list,
    fraction,
    integer,
    is_false,
    message_format_version,
    one_of,
    throttled_replicas,
)
from broker_core.topic_config_checks import (
    list_items as list_items,  # its callers read it from here
)

COMPRESSION_TYPES = (*CODEC_BY_NAME, PRODUCER)
"""The values of ``compression.type``, for topics and the broker default."""
CLEANUP_POLICIES = ("delete", "compact")
"""The items ``cleanup.policy`` may list."""
INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1
MAX_VALUE_CHARS = 1024
"""The longest topic config value taken (INVALID_CONFIG beyond): Kafka bounds a value
only by its request's size, but none of the keys here needs more (the lists,
``cleanup.policy`` and the throttled replicas, are short), and a tenant must not store
megabytes in the topic metadata every broker holds, nor make each alter parse them."""

# Config types as DescribeConfigs (v3+) reports them.
TYPE_BOOLEAN, TYPE_STRING, TYPE_INT, TYPE_LONG, TYPE_DOUBLE, TYPE_LIST = 1, 2, 3, 5, 6, 7

ENFORCED, NO_OP = "enforced", "no-op"
"""What a key does on this broker: acted on, or taken, checked, kept and described
only (its ``doc`` says why)."""


def _policy(value: str) -> bool:
    items = list_items(value)
    return bool(items) and all(item in CLEANUP_POLICIES for item in items)


@dataclass(frozen=True, slots=True)
class TopicConfigKey:
    """One topic config key: its default value, its check and what it does here."""

    name: str
    default: str
    check: Callable[[str], bool]
    expected: str
    doc: str
    """What it does on this broker (DescribeConfigs' documentation, the README's table)."""
    kind: int
    """Its type in DescribeConfigs."""
    server: str | None
    """Kafka's broker config that sets its default (None: Kafka has none)."""
    canonical: Callable[[str], str] = str
    """The value as stored once its check passed (a number as its digits, without the
    leading zeros Kafka's parser accepts and Python's ``int`` refuses beyond 4,300
    digits), as Kafka's DescribeConfigs gives it back."""
    effect: str = ENFORCED
    """:data:`ENFORCED` or :data:`NO_OP`."""


def _whole(value: str) -> str:
    return str(whole_number(value))


def _long(name: str, default: str, low: int, doc: str, server: str,
          effect: str = ENFORCED) -> TopicConfigKey:
    return TopicConfigKey(name, default, integer(low, LONG_MAX), f"an integer >= {low}", doc,
                          TYPE_LONG, server, _whole, effect)


def _int(name: str, default: str, low: int, doc: str, server: str,
         effect: str = ENFORCED) -> TopicConfigKey:
    return TopicConfigKey(name, default, integer(low, INT_MAX),
                          f"an integer >= {low} and <= {INT_MAX}", doc, TYPE_INT, server,
                          _whole, effect)


def _level(name: str, default: int, low: int, high: int, unset: int | None = None
           ) -> TopicConfigKey:
    also = "" if unset is None else f" or {unset}"
    return TopicConfigKey(
        name, str(default), integer(low, high, unset), f"an integer from {low} to {high}{also}",
        f"The {name.split('.')[1]} level Kafka compresses batches with when "
        "compression.type names that codec; here a batch compressed again on its way in "
        "takes one fixed level per codec (taken and described only).", TYPE_INT, name,
        _whole, NO_OP)


def _flag(name: str, default: str, doc: str, server: str | None,
          effect: str = NO_OP) -> TopicConfigKey:
    return TopicConfigKey(name, default, boolean, "'true' or 'false'", doc, TYPE_BOOLEAN,
                          server, canonical_boolean, effect)


def _throttled(name: str, side: str) -> TopicConfigKey:
    return TopicConfigKey(
        name, "", throttled_replicas, "'*' or a list of partition:broker items",
        f"The replicas whose {side} replication Kafka throttles; a partition has one "
        "replica here and nothing replicates (taken and described only).", TYPE_LIST,
        name, canonical_list, NO_OP)


def config_number(configs: Mapping[str, str], name: str) -> int:
    """An integer config's value (``whole_number``: a value stored before values were
    kept canonical may still carry any number of leading zeros)."""
    return whole_number(configs[name])


_NO_TIERED_STORAGE = "'false' (this broker has no tiered storage: Tiered Storage " \
    "functionality is disabled in the broker, a topic cannot be configured with remote " \
    "log storage)"

_KEYS = (
    TopicConfigKey("cleanup.policy", "delete", _policy,
                   "'delete', 'compact' or both, comma-separated",
                   "delete: retention deletes whole ledgers. compact: records must carry a key"
                   " (INVALID_RECORD otherwise), retention deletes nothing and the log "
                   "cleaner keeps only the latest record of each key. "
                   "compact,delete: both.", TYPE_LIST, "log.cleanup.policy",
                   lambda value: ",".join(dict.fromkeys(list_items(value)))),
    _long("retention.ms", "604800000", -1,
          "Ledgers older than this are deleted (-1 keeps them forever); when the open "
          "one is as old too (an idle partition), a new one is rolled and every record "
          "goes: the log start moves to the log end, as on Kafka.", "log.retention.ms"),
    _long("retention.bytes", "-1", -1,
          "Oldest ledgers are deleted while a partition would still hold this much "
          "without them: never the open one, but at 0. Neither retention goes past the "
          "high watermark: records waiting for their fsync (`flush.messages`) stay until "
          "their producers are answered, as on Kafka.",
          "log.retention.bytes"),
    _int("segment.bytes", "1073741824", 1024,
         "A new ledger is started when the open one reaches this size.", "log.segment.bytes"),
    _long("segment.ms", "604800000", 1,
          "A new ledger is started when the open one is this old.", "log.roll.ms"),
    _long("segment.jitter.ms", "0", 0,
          "Kafka subtracts a random jitter up to this from segment.ms so that partitions "
          "do not all roll at once; ledgers here roll at segment.ms exactly (taken and "
          "described only).", "log.roll.jitter.ms", NO_OP),
    _int("segment.index.bytes", "10485760", 4,
         "The size Kafka preallocates for a segment's offset index; the ledger index here "
         "is sparse (index.interval.bytes) and grows as needed (taken and described only).",
         "log.index.size.max.bytes", NO_OP),
    _int("index.interval.bytes", "4096", 0,
         "Bytes between two entries of the sparse offset index.", "log.index.interval.bytes"),
    _long("flush.messages", str(LONG_MAX), 1,
          "A partition is fsynced once this many records are unflushed, and their "
          "producers are answered after that fsync (flushIntervalMessages for the topic; "
          "unset, the broker's flushIntervalMessages applies, and DescribeConfigs shows it; "
          "no effect on PostgreSQL, where every append is committed).",
          "log.flush.interval.messages"),
    _long("flush.ms", str(LONG_MAX), 0,
          "A partition appended to is fsynced within this many ms: shorter than the "
          "broker's flushIntervalMs it fsyncs the topic's partitions sooner; longer, the "
          "broker's periodic fsync still takes them (a topic cannot loosen the broker's "
          "durability). Unset, the broker's flushIntervalMs applies, and DescribeConfigs "
          "shows it. No effect on PostgreSQL.", "log.flush.interval.ms"),
    _long("file.delete.delay.ms", "60000", 0,
          "How long Kafka keeps a deleted segment's file before removing it; a ledger "
          "that retention or the cleaner drops is unlinked at once here (taken and "
          "described only).", "log.segment.delete.delay.ms", NO_OP),
    _flag("preallocate", "false",
          "Whether Kafka preallocates a new segment's file; ledgers here grow as written "
          "(taken and described only).", "log.preallocate"),
    _int("max.message.bytes", "1048588", 0,
         "Largest record batch a producer may send.", "message.max.bytes"),
    TopicConfigKey("message.timestamp.type", "CreateTime",
                   one_of("CreateTime", "LogAppendTime"), "'CreateTime' or 'LogAppendTime'",
                   "Keep the producer's timestamps, or stamp batches with the broker's time.",
                   TYPE_STRING, "log.message.timestamp.type"),
    _long("message.timestamp.before.max.ms", str(LONG_MAX), 0,
          "With CreateTime, a batch whose first or largest timestamp is more than this "
          "before the broker's clock is refused with INVALID_TIMESTAMP (KIP-937). At its "
          "default, message.timestamp.difference.max.ms applies instead.",
          "log.message.timestamp.before.max.ms"),
    _long("message.timestamp.after.max.ms", str(LONG_MAX), 0,
          "With CreateTime, a batch whose first or largest timestamp is more than this "
          "after the broker's clock is refused with INVALID_TIMESTAMP (KIP-937; Kafka 4.0 "
          "defaults to 3600000). At its default, message.timestamp.difference.max.ms "
          "applies instead.", "log.message.timestamp.after.max.ms"),
    _long("message.timestamp.difference.max.ms", str(LONG_MAX), 0,
          "Deprecated (Kafka 3.6; gone in 4.0): the bound on both sides, where "
          "message.timestamp.before.max.ms or message.timestamp.after.max.ms is left at "
          "its default.", "log.message.timestamp.difference.max.ms"),
    TopicConfigKey("message.format.version", "3.0-IV1", message_format_version,
                   "a Kafka version, e.g. '0.10.2' or '3.0-IV1'",
                   "Deprecated (Kafka 3.0; gone in 4.0): the record format Kafka writes for "
                   "old clients; batches are stored as produced, in format v2 (taken and "
                   "described only).", TYPE_STRING, "log.message.format.version",
                   effect=NO_OP),
    _flag("message.downconversion.enable", "true",
          "Whether Kafka converts batches for fetches of versions older than the record "
          "format; only v2 batches are served here, to Fetch v4 and later (taken and "
          "described only; gone in Kafka 4.0).", "log.message.downconversion.enable"),
    _int("min.insync.replicas", "1", 1,
         "acks=all produce fails with NOT_ENOUGH_REPLICAS above 1 (one replica).",
         "min.insync.replicas"),
    _flag("unclean.leader.election.enable", "false",
          "Whether Kafka may elect a replica not in sync as leader; a partition has one "
          "replica here, and on a cluster its next owner reads the same stored log "
          "(taken and described only).", "unclean.leader.election.enable"),
    _throttled("leader.replication.throttled.replicas", "leader-side"),
    _throttled("follower.replication.throttled.replicas", "follower-side"),
    TopicConfigKey("compression.type", PRODUCER, one_of(*COMPRESSION_TYPES),
                   " or ".join(f"'{name}'" for name in COMPRESSION_TYPES),
                   "The codec batches are stored in: 'gzip', 'snappy', 'lz4' or 'zstd', "
                   "'uncompressed', or 'producer' to keep the producer's. A batch in "
                   "another codec is compressed again on its way in.", TYPE_STRING,
                   "compression.type"),
    _level("compression.gzip.level", -1, 1, 9, unset=-1),
    _level("compression.lz4.level", 9, 1, 17),
    _level("compression.zstd.level", 3, -131072, 22),
    TopicConfigKey("min.cleanable.dirty.ratio", "0.5", fraction, "a number from 0 to 1",
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
    TopicConfigKey("remote.storage.enable", "false", is_false, _NO_TIERED_STORAGE,
                   "Tiered storage (KIP-405): this broker has none, so only 'false' is "
                   "taken; 'true' is INVALID_CONFIG.", TYPE_BOOLEAN, None,
                   canonical_boolean, NO_OP),
    _long("local.retention.ms", "-2", -2,
          "With tiered storage, how long segments stay on local disk (-2: retention.ms); "
          "without it (here) retention.ms alone applies (taken and described only).",
          "log.local.retention.ms", NO_OP),
    _long("local.retention.bytes", "-2", -2,
          "With tiered storage, how large the local part may grow (-2: retention.bytes); "
          "without it (here) retention.bytes alone applies (taken and described only).",
          "log.local.retention.bytes", NO_OP),
    _flag("remote.log.copy.disable", "false",
          "With tiered storage, stops copying segments to remote storage; none here "
          "(taken and described only).", None),
    _flag("remote.log.delete.on.disable", "false",
          "With tiered storage, deletes the remote data when it is turned off; none here "
          "(taken and described only).", None),
)
"""Every topic config of Kafka 3.9's ``TopicConfig`` (with the keys Kafka 4.0 removed,
which 3.x clients still send), in the order of its documentation's groups."""

# Config sources as DescribeConfigs and CreateTopics report them.
DYNAMIC_TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5

TOPIC_CONFIG_KEYS: Mapping[str, TopicConfigKey] = {key.name: key for key in _KEYS}
BROKER_SYNONYMS: Mapping[str, TopicConfigKey] = {
    key.server: key for key in _KEYS if key.server is not None}
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


_TYPE_NAMES = {TYPE_BOOLEAN: "boolean", TYPE_STRING: "string", TYPE_INT: "int",
               TYPE_LONG: "long", TYPE_DOUBLE: "double", TYPE_LIST: "list"}


def topic_config_markdown(broker_defaults: Mapping[str, str] | None = None) -> str:
    """The README's table of topic configs (between the ``topic-config-table`` markers):
    every key, its type, default, broker synonym, whether it is enforced here, and what
    it does. ``broker_defaults`` words the default of the keys whose default a broker
    config key sets here (topic key -> its text), which replaces the key's own."""
    rows = ["| key | type | default | broker default from | here | what it does here |",
            "|---|---|---|---|---|---|"]
    for key in _KEYS:
        server = f"`{key.server}`" if key.server is not None else "(none)"
        default = f"`{key.default}`" if key.default else "(empty)"
        if broker_defaults is not None and key.name in broker_defaults:
            default = broker_defaults[key.name]
        rows.append(f"| `{key.name}` | {_TYPE_NAMES[key.kind]} | {default} | "
                    f"{server} | {key.effect} | {key.doc} |")
    return "\n".join(rows) + "\n"
