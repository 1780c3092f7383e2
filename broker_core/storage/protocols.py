"""The storage interface every engine implements: ``Storage``, ``PartitionStore`` and
``KeyValueStore``.

They hold exactly what the engine, the APIs and the edge call on storage; nothing outside
``broker_core/storage/`` touches files, directories or disk figures. An engine is one
module that implements these and registers its URL scheme in ``engines``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeGuard, TypeVar, runtime_checkable

from broker_core.codec.batch_header import BatchHeader
from broker_core.codec.varints import Buffer

from .cluster import ClusterStore
from .config import LogConfig
from .damage import Damage
from .feed import ChangeFeed
from .model import BatchInfo, NewTopic, TenantCap, TopicInfo
from .region import FileRegion
from .retention import RetentionCut, RetentionDue
from .segments import SealedSegment

T = TypeVar("T")


@dataclass(frozen=True)
class DiskUsage:
    """Space of the storage's volume, as DescribeLogDirs reports it."""

    total_bytes: int
    usable_bytes: int


class KeyValueStore(Protocol):
    """A small key-value area for what is not a log (cluster id, producer-id blocks, ACLs,
    producer snapshots). Keys are short names without ``/``; values are bytes."""

    def get(self, key: str) -> bytes | None:
        """The value stored under ``key``, or None if there is none."""
        ...

    def put(self, key: str, value: bytes, *, durable: bool = True) -> None:
        """Replace the value under ``key`` atomically: a reader sees the old value or the
        new one. ``durable`` waits until the value survives a power loss. Raises OSError
        when it cannot be stored, LogClosed when the area's partition is gone."""
        ...

    def compare_and_set(self, key: str, expected: bytes | None, value: bytes) -> bool:
        """Store ``value`` under ``key`` (durably) only if the value there is ``expected``
        (None: no value); return whether it was stored. Atomic against every other
        ``compare_and_set`` of the key by any broker sharing the storage, so a
        read-modify-write loop over it never loses an update (producer-id blocks, the
        cluster id, ACLs). Raises as :meth:`put`."""
        ...


class PartitionStore(Protocol):
    """The log of one partition: continuous offsets from ``log_start_offset`` to
    ``next_offset`` (what is written; readers see up to the high watermark, which the
    fsync policy may hold below it: ``durability.FlushScheduler.high_watermark``)."""

    @property
    def location(self) -> str:
        """Where the partition lives, for log lines."""
        ...

    @property
    def log_start_offset(self) -> int: ...

    @property
    def next_offset(self) -> int: ...

    @property
    def opened_next_offset(self) -> int:
        """The next offset when the log was opened: offsets below it were written before."""
        ...

    @property
    def size_bytes(self) -> int: ...

    @property
    def offline(self) -> bool:
        """Whether the partition is offline until restart (a failed fsync or write)."""
        ...

    @property
    def state(self) -> KeyValueStore:
        """The partition's own key-value area, deleted with it (producer snapshots)."""
        ...

    def append(self, batch: Buffer, header: BatchHeader) -> int:
        """Store one record batch whose header was read as ``header`` (its last offset
        delta and max timestamp are taken from there) at the next offset, written as its
        base offset in what is stored; return that offset. ``batch`` may be the request's
        own bytes: an engine that keeps them past the call keeps a copy (a ``bytearray``
        given may be patched in place instead)."""
        ...

    def read(self, offset: int, max_bytes: int) -> list[memoryview | FileRegion]:
        """Batches from the one holding ``offset`` up to ``max_bytes`` (the first whole)."""
        ...

    def batches_from(self, offset: int) -> Iterator[BatchInfo]: ...

    def headers_from(self, offset: int) -> Iterator[BatchInfo]:
        """As :meth:`batches_from`, but a batch that is not a control batch may come as
        its 61-byte header alone: all that rebuilding the producer state reads (an engine
        whose batches cross a network sends only that much)."""
        ...

    def find_first_batch_with_timestamp_at_least(self, timestamp: int,
                                                 from_offset: int = 0) -> BatchInfo | None:
        """The first batch whose maxTimestamp >= ``timestamp`` among those holding an
        offset at or above the log start and ``from_offset``."""
        ...

    def batch_with_max_timestamp(self, from_offset: int = 0) -> BatchInfo | None:
        """The batch with the largest maxTimestamp (the first of them) among those holding
        an offset at or above the log start and ``from_offset``."""
        ...

    def delete_records_before(self, offset: int) -> int:
        """Move the log start up to ``offset`` (DeleteRecords); return the log start. On
        the event loop, or in a worker thread if :attr:`drops_in_thread`."""
        ...

    @property
    def drops_in_thread(self) -> bool:
        """Whether DeleteRecords and retention's drop run in a worker thread
        (``retention.RetainsSegments.drops_in_thread``)."""
        ...

    def damaged_ranges(self) -> list[Damage]: ...

    def needs_verification(self, offset: int) -> bool:
        """Whether a read at ``offset`` should first run ``verify_at`` in a worker."""
        ...

    def verify_at(self, offset: int) -> None: ...

    def start_writeback(self) -> None: ...

    def sealed_segments(self) -> list[SealedSegment]:
        """The sealed segments holding offsets at or above the log start, in offset order
        (never the one appends go to): what the log cleaner may rewrite."""
        ...

    def replace_segments(self, segments: Sequence[SealedSegment],
                         batches: Sequence[BatchInfo]) -> bool:
        """Swap every batch of ``segments`` (one, or several adjacent ones, merged into
        one segment: the first's) for ``batches``, which cover exactly their offsets
        (``segments.check_cover``; ValueError otherwise), atomically: a reader sees all old
        batches or all new ones, and a crash at any point leaves one of the two. False, and
        nothing changed, when a segment is no longer as given (dropped by retention,
        damaged, or the partition is no longer this broker's to write)."""
        ...

    def retention_due(self) -> RetentionCut | None:
        """What retention drops now, or None; reads only (any thread)."""
        ...

    def drop_retained(self, cut: RetentionCut) -> int:
        """Drop the sealed segments wholly below ``cut.keep_from``; how many went."""
        ...

    def flush(self) -> bool:
        """Make what was appended so far durable; return whether the partition's metadata
        was rewritten too (a checkpoint)."""
        ...


@runtime_checkable
class GroupCommitted(Protocol):
    """A partition store whose appends are committed in groups (``postgres``): on the
    event loop an append need not wait for its commit there."""

    @property
    def generation(self) -> int:
        """Moves on whenever what the broker holds of the partition may be wrong: an
        append failed (its commit's outcome is then unknown, the appends queued behind it
        fail too), another write to it failed, or it was taken or given up. What was
        judged against the partition as it was before, such as a producer's sequence, must
        be judged again against what is stored."""
        ...

    def settle(self) -> None:
        """Wait (blocking) until every append queued so far is answered, committed or
        failed: what is stored then holds all of them that will ever be stored; and, when
        one failed, reload the partition's ends from what is stored (a commit whose answer
        was lost may have happened), so reads go as far as what is stored."""
        ...

    def holds(self, base: int, batch: Buffer) -> bool:
        """Whether ``batch`` (as appended: its records, whatever its base offset) is
        stored at offset ``base`` (blocking; an OSError when that cannot be read now):
        how an append whose commit's answer was lost learns its outcome."""
        ...

    def append_deferred(self, batch: Buffer, header: BatchHeader,
                        generation: int | None = None) -> tuple[int, asyncio.Future[None]]:
        """Like ``append``, from the event loop: the base offset at once, and a future done
        once the batch is committed (failed with an OSError when it was not: it is then
        not stored, and neither is anything queued behind it on the partition). With
        ``generation`` (the one the batch was judged at), an ``AppendAbandoned`` at once
        if the partition's has moved on since."""
        ...


_GROUP_COMMITTED: dict[type, bool] = {}
"""Per partition store class, whether it is :class:`GroupCommitted`: a runtime protocol's
``isinstance`` walks the protocol's members each time (a few percent of a produce's CPU),
a class's answer never changes."""


def group_committed(partition: PartitionStore) -> TypeGuard[GroupCommitted]:
    """Whether ``partition`` is :class:`GroupCommitted` (cheap: once per class)."""
    kind = type(partition)
    found = _GROUP_COMMITTED.get(kind)
    if found is None:
        found = _GROUP_COMMITTED[kind] = isinstance(partition, GroupCommitted)
    return found


def commit_generation(partition: PartitionStore) -> int:
    """The partition's :attr:`GroupCommitted.generation` (0 for a store whose appends
    are answered once written: a failed one fails its caller, nothing waits behind it)."""
    return partition.generation if group_committed(partition) else 0


RowReader = Callable[[int, int | None, int | None, int], list[BatchInfo]]
"""``read(since, before, also, limit)``: a partition's stored batches newest first, those
whose base offset is at least ``since`` and below ``before`` (None: any), at most
``limit``, then the one whose base offset is ``also`` if it is stored and lies below
``since`` (None: none)."""


@runtime_checkable
class SharedLog(Protocol):
    """A partition store several brokers share (``postgres``): one broker writes it, and
    any broker reads what that one committed, also past what it has seen itself."""

    def search(self, plan: Callable[[RowReader], T]) -> T:
        """Run ``plan`` on the stored batches as its owner committed them (whichever broker
        that is), every read of one run from one snapshot of the storage: first allowed
        one read (one round trip); a second read cuts that run short (an exception
        ``plan`` lets through), and ``plan`` runs again from the start in a read-only
        snapshot, reading as often as it needs. So what ``plan`` keeps of a run cut short
        must hold on its own. Blocking (a worker thread); DatabaseUnavailable when the
        storage cannot answer."""
        ...


def shared_log(partition: PartitionStore) -> TypeGuard[SharedLog]:
    """Whether ``partition`` is :class:`SharedLog`."""
    return isinstance(partition, SharedLog)


@dataclass(frozen=True)
class Refreshed:
    """What other brokers sharing the storage changed since the last ``refresh``."""

    gone: Mapping[str, Sequence[PartitionStore]] = field(default_factory=dict)
    """Topics dropped from this broker's view (deleted, or deleted and created again under
    the same name), with the partition stores they had (now closed)."""
    kv_changed: bool = False
    """Whether a value of the storage's key-value area (``Storage.kv``) may have changed."""


NOTHING_CHANGED = Refreshed()


class Storage(Protocol):
    """The topics of one broker and the partition store of each, plus a key-value area."""

    @property
    def default_config(self) -> LogConfig: ...

    @property
    def location(self) -> str:
        """The log dir DescribeLogDirs names (an absolute path or the engine's URL)."""
        ...

    def names_location(self, path: str) -> bool:
        """Whether a client's log dir ``path`` names ``location`` (AlterReplicaLogDirs)."""
        ...

    @property
    def kv(self) -> KeyValueStore: ...

    @property
    def cluster(self) -> ClusterStore:
        """Brokers and partition owners (one broker owning everything, unless shared)."""
        ...

    def disk_usage(self) -> DiskUsage: ...

    def create_topic(self, name: str, num_partitions: int,
                     configs: Mapping[str, str]) -> TopicInfo: ...

    def create_topics(self, wanted: Sequence[NewTopic]) -> list[TopicInfo | Exception]:
        """Create several topics at once (the file engine makes them durable together);
        for each, its info or why it was not created (TopicExists, ValueError, OSError, a
        StorageError). Safe to call from a worker thread: lookups go on meanwhile."""
        ...

    def delete_topic(self, name: str) -> None: ...

    def add_partitions(self, name: str, new_total: int,
                       cap: TenantCap | None = None) -> TopicInfo:
        """Grow the topic to ``new_total`` partitions (CapExceeded when that would take its
        tenant beyond ``cap``, on an engine shared by several brokers)."""
        ...

    def alter_topic_configs(self, name: str, configs: Mapping[str, str],
                            expected: Mapping[str, str] | None = None) -> TopicInfo:
        """Replace the topic's configs; with ``expected``, only if the stored configs are
        still those (ConfigsChanged otherwise, atomic against every broker sharing the
        storage), so a read-modify-write never drops another broker's change."""
        ...

    def topic(self, name: str) -> TopicInfo | None: ...

    def topics(self) -> list[TopicInfo]: ...

    def partition(self, name: str, partition: int) -> PartitionStore | None: ...

    def all_partitions(self) -> Iterator[tuple[str, int, PartitionStore]]: ...

    def topic_sizes(self) -> dict[str, int]:
        """Bytes stored per topic, every partition's size summed, as one read: on a shared
        engine what every broker stored, not this broker's view of it (the tenant storage
        quota). May take a database round trip: call it from a worker thread."""
        ...

    def retention_due(self) -> list[RetentionDue]:
        """What retention drops of every partition now; reads only (on PostgreSQL a query
        per partition with sealed segments): call it from a worker thread."""
        ...

    def drop_retained(self, due: Sequence[RetentionDue]) -> int:
        """Drop what ``retention_due`` found, on the event loop (where the reads that walk
        a log run), or in a worker thread for the partitions that say
        ``drops_in_thread``; the number of segments dropped."""
        ...

    def enforce_retention(self) -> int:
        """Both at once (tools, tests)."""
        ...

    def refresh(self) -> Refreshed:
        """Take in what other brokers sharing the storage changed (topics created, deleted,
        grown or reconfigured; key-value writes). Call it when ``feed`` says so (``CHANGES``)
        and now and then, every fraction of a second while the feed is not live; it is
        cheap when nothing changed, and a no-op on engines one process owns (file,
        memory). Raises OSError while the storage cannot be read."""
        ...

    @property
    def feed(self) -> ChangeFeed:
        """Wake-ups when other brokers sharing the storage change something (``feed``)."""
        ...

    def close(self) -> list[str]:
        """Close every partition; the problems, one line each (the rest still closed)."""
        ...

    def discard_created(self, *, at_close: bool = False) -> None:
        """After a failed start: remove what this storage created, now (closing it) or,
        with ``at_close``, when :meth:`close` runs."""
        ...
