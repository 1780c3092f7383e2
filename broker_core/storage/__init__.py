"""Storage: the interface every engine implements, and the engines.

Public API: ``open_storage`` chooses an engine by URL (``engines``) and returns a
``Storage`` (``protocols``), which owns topics (``TopicInfo``), the ``PartitionStore`` of
each partition and a small ``KeyValueStore`` for what is not a log. ``file://`` is the
managed ledger on local files (``LogManager``, ``PartitionLog``), ``memory://`` keeps all
in this process (``memory``), ``postgres://`` in a PostgreSQL database (``postgres``).
"""

from __future__ import annotations

from .config import TOPIC_CONFIG_FIELDS, LogConfig, log_config_for_topic
from .dir_lock import DataDirLocked
from .engines import ENGINES, open_storage, storage_path_from_url, storage_scheme
from .errors import (
    CapExceeded,
    ConfigsChanged,
    CorruptLedger,
    DatabaseUnavailable,
    LogClosed,
    LogOffline,
    OffsetOutOfRange,
    StorageError,
    TopicExists,
    UnknownTopic,
)
from .log_manager import LogManager
from .model import BatchInfo, NewTopic, TenantCap, TopicInfo, wall_clock_ms
from .partition import PartitionLog
from .partition_flush import flush_together
from .pg_schema import SchemaTooNew
from .protocols import (
    DiskUsage,
    GroupCommitted,
    KeyValueStore,
    PartitionStore,
    Refreshed,
    RowReader,
    SharedLog,
    Storage,
    commit_generation,
    group_committed,
    shared_log,
)
from .region import FileRegion
from .segments import SealedSegment, check_cover

__all__ = [
    "ENGINES",
    "TOPIC_CONFIG_FIELDS",
    "BatchInfo",
    "CapExceeded",
    "ConfigsChanged",
    "CorruptLedger",
    "DataDirLocked",
    "DatabaseUnavailable",
    "DiskUsage",
    "FileRegion",
    "GroupCommitted",
    "KeyValueStore",
    "LogClosed",
    "LogConfig",
    "LogManager",
    "LogOffline",
    "NewTopic",
    "OffsetOutOfRange",
    "PartitionLog",
    "PartitionStore",
    "Refreshed",
    "RowReader",
    "SchemaTooNew",
    "SealedSegment",
    "SharedLog",
    "Storage",
    "StorageError",
    "TenantCap",
    "TopicExists",
    "TopicInfo",
    "UnknownTopic",
    "check_cover",
    "commit_generation",
    "flush_together",
    "group_committed",
    "log_config_for_topic",
    "open_storage",
    "shared_log",
    "storage_path_from_url",
    "storage_scheme",
    "wall_clock_ms",
]
