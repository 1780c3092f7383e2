"""Storage: the managed ledger (partition logs of ledgers of entries) and its topics.

Public API: ``open_storage`` chooses an engine by URL and returns a ``LogManager``,
which owns topics (``TopicInfo``) and the ``PartitionLog`` of each partition.
"""

from __future__ import annotations

from .config import TOPIC_CONFIG_FIELDS, LogConfig, log_config_for_topic
from .dir_lock import DataDirLocked
from .engines import open_storage, storage_path_from_url
from .errors import (
    CorruptLedger,
    LogClosed,
    LogOffline,
    OffsetOutOfRange,
    StorageError,
    TopicExists,
    UnknownTopic,
)
from .log_manager import LogManager, TopicInfo
from .partition import BatchInfo, PartitionLog, wall_clock_ms
from .region import FileRegion

__all__ = [
    "TOPIC_CONFIG_FIELDS",
    "BatchInfo",
    "CorruptLedger",
    "DataDirLocked",
    "FileRegion",
    "LogClosed",
    "LogConfig",
    "LogManager",
    "LogOffline",
    "OffsetOutOfRange",
    "PartitionLog",
    "StorageError",
    "TopicExists",
    "TopicInfo",
    "UnknownTopic",
    "log_config_for_topic",
    "open_storage",
    "storage_path_from_url",
    "wall_clock_ms",
]
