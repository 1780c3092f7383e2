"""The engine's settings, as the composition root fills them in from the broker config
(:class:`EngineConfig`, with the Kafka broker configs DescribeConfigs shows:
:class:`BrokerSetting`), and what produce derives from a topic's configs
(:class:`ProduceRules`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from broker_core import metrics
from broker_core.cluster.service import ClusterConfig
from broker_core.codec.compression import codec_of
from broker_core.durability import TopicFlush
from broker_core.groups.config import GroupConfig
from broker_core.loop_metrics import LoopCounter
from broker_core.partition_producers import DEFAULT_EXPIRATION_MS
from broker_core.produce_timestamps import TimestampBounds
from broker_core.topic_configs import LONG_MAX, config_number, list_items
from broker_core.transactions.coordinator import TxnConfig
from common.names import DEFAULT_METADATA_NAMESPACE, DEFAULT_METADATA_TENANT


@dataclass(frozen=True, slots=True)
class BrokerSetting:
    """A Kafka broker config that DescribeConfigs shows for this broker (besides the
    topic defaults under their broker names), and where its value comes from."""

    value: str
    kind: int
    """Its type in DescribeConfigs (``broker_core.topic_configs.TYPE_*``)."""
    configured: bool
    """Whether the broker's config file or command line set it (STATIC_BROKER_CONFIG),
    else it is the default (DEFAULT_CONFIG)."""
    doc: str
    """What sets it here (DescribeConfigs' documentation)."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The engine's settings, filled in by the composition root from the broker config."""

    broker_id: int = 0
    cluster_id: str = "edge-broker"
    allow_auto_topic_creation: bool = True
    validate_records: bool = True
    default_num_partitions: int = 1
    flush_interval_messages: int = 2**63 - 1
    flush_interval_ms: int = 1000
    retention_check_interval_ms: int = 300_000
    log_cleaner_enable: bool = True
    log_cleaner_backoff_ms: int = 15_000
    log_cleaner_io_max_bytes_per_second: int = 50 << 20
    log_cleaner_dedupe_buffer_size: int = 128 << 20
    producer_id_expiration_ms: int = DEFAULT_EXPIRATION_MS
    producer_id_expiration_check_interval_ms: int = 600_000
    topic_defaults: Mapping[str, str] = field(default_factory=dict)
    """Topic configs whose default is not the key's own (the broker config's); ``flush.*``
    default to this config's flush policy where not given (:meth:`topic_default_values`)."""
    configured_topic_defaults: frozenset[str] = frozenset()
    """Topic configs whose default the broker's config file or command line set
    (DescribeConfigs reports them as STATIC_BROKER_CONFIG where a topic does not)."""
    metadata_tenant: str = DEFAULT_METADATA_TENANT
    metadata_namespace: str = DEFAULT_METADATA_NAMESPACE
    multi_tenant_metadata: bool = True
    offsets_topic_partitions: int = 50
    offsets_topic_segment_bytes: int = 16 * 1024 * 1024
    offsets_topic_compaction_bytes: int = 64 * 1024 * 1024
    groups: GroupConfig = field(default_factory=GroupConfig)
    listed_namespaces: tuple[str, ...] = ()
    txn_topic_partitions: int = 50
    broker_configs: Mapping[str, BrokerSetting] = field(default_factory=dict)
    """Kafka broker configs by name (what the BROKER resource's DescribeConfigs shows
    besides the topic defaults)."""
    transactions: TxnConfig = field(default_factory=TxnConfig)
    fetch_max_bytes: int = 57_671_680
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def topic_default_values(self) -> dict[str, str]:
        """:attr:`topic_defaults`, with ``flush.messages`` and ``flush.ms`` taken from the
        broker-wide flush policy where not given (an unset topic follows the broker)."""
        return {"flush.messages": str(self.flush_interval_messages),
                "flush.ms": flush_ms_default(self.flush_interval_ms),
                **self.topic_defaults}


def flush_ms_default(flush_interval_ms: int) -> str:
    """The ``flush.ms`` a topic inherits from ``flushIntervalMs`` (0, no periodic fsync,
    is ``flush.ms`` at its largest: never)."""
    return str(LONG_MAX if flush_interval_ms == 0 else flush_interval_ms)


@dataclass(frozen=True, slots=True)
class ProduceRules:
    """A topic's produce-time settings and counters, derived from its configs."""

    configs: Mapping[str, str]
    max_message_bytes: int
    min_insync_replicas: int
    log_append_time: bool
    codec: int | None
    """The codec batches are stored in (``compression.type``; None: the producer's)."""
    keyed: bool
    """Records must carry a key (``cleanup.policy`` includes ``compact``)."""
    timestamps: TimestampBounds | None
    """The bounds of produced timestamps (None: none checked)."""
    flush: TopicFlush
    """When the topic's partitions are fsynced (``flush.messages``, ``flush.ms``)."""
    messages_in: LoopCounter
    bytes_in: LoopCounter

    @classmethod
    def of(cls, internal: str, own: Mapping[str, str],
           settings: Mapping[str, str]) -> ProduceRules:
        """The rules of topic ``internal`` with its own configs ``own`` and every config's
        effective value ``settings``."""
        return cls(own, config_number(settings, "max.message.bytes"),
                   config_number(settings, "min.insync.replicas"),
                   settings["message.timestamp.type"] == "LogAppendTime",
                   codec_of(settings["compression.type"]),
                   "compact" in list_items(settings["cleanup.policy"]),
                   TimestampBounds.of(settings),
                   TopicFlush(config_number(settings, "flush.messages"),
                              config_number(settings, "flush.ms")),
                   metrics.MESSAGES_IN.labels(internal), metrics.BYTES_IN.labels(internal))
