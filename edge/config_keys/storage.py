"""Configuration keys of produce checks, topic creation, the storage engine, ledgers
and their fsync policy, retention, and the log cleaner of compacted topics.

These groups of keys are bases of :class:`edge.config.BrokerConfig` (see
:mod:`edge.config` for how a key is declared).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel

from common.settings import LONG_MAX, key
from edge.config_types import INT_MAX, CompressionType, StorageUrl


class StorageKeys(BaseModel):
    """How produced batches are checked and topics created, where and how the log is stored
    (engine, fsync policy, ledger rollover, codec) and how long it is kept."""

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


class LogCleanerKeys(BaseModel):
    """The log cleaner of compacted topics: whether it runs, how often and how fast."""

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
