"""Configuration keys of where system topics live, consumer groups and their offsets,
transactions and the producer ids partitions remember.

These groups of keys are bases of :class:`edge.config.BrokerConfig` (see
:mod:`edge.config` for how a key is declared).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel

from broker_core.groups.config import GROUP_MAX_SIZE, GROUP_METADATA_MAX_BYTES
from common.names import DEFAULT_METADATA_NAMESPACE, DEFAULT_METADATA_TENANT
from common.settings import key
from edge.config_types import INT_MAX, Name


class CoordinatorKeys(BaseModel):
    """Where system topics live, consumer groups and their committed offsets, transactions
    and the producer ids partitions remember."""

    kafka_metadata_tenant: Annotated[Name, key(
        "kafkaMetadataTenant",
        "tenant of system topics such as __consumer_offsets")] = DEFAULT_METADATA_TENANT
    kafka_metadata_namespace: Annotated[Name, key(
        "kafkaMetadataNamespace",
        "namespace of system topics")] = DEFAULT_METADATA_NAMESPACE
    kafka_enable_multi_tenant_metadata: Annotated[bool, key(
        "kafkaEnableMultiTenantMetadata",
        "keep each tenant's groups in its own <tenant>/<kafkaMetadataNamespace> system topics"
        " instead of the metadata tenant's")] = True
    group_min_session_timeout_ms: Annotated[int, key(
        "groupMinSessionTimeoutMs",
        "smallest session timeout a group member may ask for (ms)", ge=1, le=INT_MAX)] = 6000
    group_max_session_timeout_ms: Annotated[int, key(
        "groupMaxSessionTimeoutMs",
        "largest session timeout a group member may ask for (ms; KoP's default, Kafka's is "
        "1800000: raise it for static members asking more, whom INVALID_SESSION_TIMEOUT "
        "stops)", ge=1, le=INT_MAX)] = 300000
    group_initial_rebalance_delay_ms: Annotated[int, key(
        "groupInitialRebalanceDelayMs",
        "how long the first rebalance of an empty group waits for more members (ms)",
        ge=0, le=INT_MAX)] = 3000
    group_id_max_length: Annotated[int, key(
        "groupIdMaxLength",
        "longest group id accepted, in characters (INVALID_GROUP_ID beyond)", ge=1, le=32767)] = 255
    group_max_size: Annotated[int, key(
        "groupMaxSize",
        "members of one consumer group, counting the member ids handed out with "
        "MEMBER_ID_REQUIRED that have not joined yet (Kafka's group.max.size, unbounded "
        "there; a join beyond gets GROUP_MAX_SIZE_REACHED)", ge=1, le=INT_MAX)] = GROUP_MAX_SIZE
    group_metadata_max_bytes: Annotated[int, key(
        "groupMetadataMaxBytes",
        "bytes of one consumer group's members in its record (their ids, protocol metadata "
        "and assignments; Kafka bounds the record by its offsets topic's message.max.bytes): "
        "a JoinGroup or a leader's SyncGroup beyond gets UNKNOWN_SERVER_ERROR",
        ge=1024, le=INT_MAX)] = GROUP_METADATA_MAX_BYTES
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
        "committed offsets are removed once a group has been empty this long, or this long "
        "after their commit for a group that only stores offsets and for the topics a "
        "Stable consumer group no longer subscribes to",
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
        "a transactional id unused this long is forgotten; a consumer group forgets the "
        "transaction fence of a producer id whose last transaction end there is this old "
        "and that has no transactional offsets pending there (looked for every "
        "offsetsRetentionCheckIntervalMs)", ge=1, le=INT_MAX)] = 604800000
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
