"""Exceptions raised by the storage layer."""

from __future__ import annotations


class StorageError(Exception):
    """Base class of the storage layer's own errors."""


class OffsetOutOfRange(StorageError):
    """An offset lies outside ``[log_start_offset, next_offset]`` of a partition."""


class TopicExists(StorageError):
    """A topic with that name already exists."""


class CapExceeded(StorageError):
    """A creation would take a tenant beyond its ``key`` (``max_topics`` or
    ``max_partitions``) of ``cap``: it holds ``have``, the creation adds ``more``."""

    def __init__(self, key: str, cap: int, have: int, more: int) -> None:
        super().__init__(f"{have} held, {more} more would exceed {key} {cap}")
        self.key, self.cap, self.have, self.more = key, cap, have, more


class UnknownTopic(StorageError):
    """No topic with that name exists."""


class ConfigsChanged(StorageError):
    """A topic's configs were not what a compare-and-set expected (changed through another
    broker meanwhile): nothing is stored; the topic as now stored is read in."""


class LogClosed(StorageError):
    """The partition log (or the log manager) has been closed."""


class CorruptLedger(StorageError):
    """A ledger holds bytes that are not a valid entry where one was expected."""


class DamagedRecords(StorageError):
    """The offset asked for lies in a damaged range of the log (never served)."""

    def __init__(self, message: str, first_offset: int, end_offset: int) -> None:
        super().__init__(message)
        self.first_offset = first_offset
        self.end_offset = end_offset


class LogOffline(StorageError, OSError):
    """The partition log is offline until restart: an fsync or a write of it failed with an
    I/O error, so what its files hold is no longer known (after a failed fsync the kernel
    may have dropped the unwritten pages). An OSError (errno EIO), so writers that turn
    OSErrors into Kafka's storage errors handle it as they are."""


class DatabaseUnavailable(StorageError, OSError):
    """The storage database cannot be reached or refused a statement. An OSError, so
    writers answer it with Kafka's retriable storage errors (``storage_faults``)."""


class CommitUnknown(DatabaseUnavailable):
    """A commit whose statement was sent but whose answer never came (the connection
    dropped, the database went away meanwhile): its rows may or may not be stored, so
    what a writer keeps of them must be read back from the storage."""


class AppendFenced(DatabaseUnavailable):
    """An append whose commit found the partition owned by another broker (a newer epoch):
    nothing of it is stored; its producer is sent to the new owner."""


class AppendAbandoned(DatabaseUnavailable):
    """An append given up because an earlier append of its partition failed: that failure
    is the cause (already reported); this one is only its consequence."""
