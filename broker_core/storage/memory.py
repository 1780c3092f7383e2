"""The ``memory://`` engine: topics and partition logs held in this process only.

Same semantics as the managed ledger, nothing on disk, gone at exit: a partition is a list
of segments of batches (rolled by ``segment.bytes`` / ``segment.ms``, dropped whole by
retention), offsets are continuous, DeleteRecords moves the log start. Meant for tests and
throwaway brokers.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from broker_core.codec.batch_header import (
    BASE_OFFSET_END,
    BatchHeader,
    base_offset_bytes,
    check_append,
)
from broker_core.codec.varints import Buffer

from .cluster import SoloCluster
from .config import LogConfig
from .errors import OffsetOutOfRange
from .fileless import FilelessPartition, FilelessStorage
from .model import BatchInfo, TenantCap, TopicInfo
from .protocols import DiskUsage
from .region import FileRegion
from .retention import RetentionCut, retention_cut
from .segments import SealedSegment, check_cover

URL = "memory://"


def _no_check() -> None:
    return None


class MemoryKeyValues:
    """Values in a dict; ``check`` raises once the owner is gone; thread-safe."""

    def __init__(self, check: Callable[[], None] = _no_check) -> None:
        self._values: dict[str, bytes] = {}
        self._check = check
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        return self._values.get(key)

    def put(self, key: str, value: bytes, *, durable: bool = True) -> None:
        self._check()
        with self._lock:
            self._values[key] = bytes(value)

    def compare_and_set(self, key: str, expected: bytes | None, value: bytes) -> bool:
        self._check()
        with self._lock:
            if self._values.get(key) != expected:
                return False
            self._values[key] = bytes(value)
            return True


@dataclass
class _Segment:
    first_offset: int
    created_ms: int
    next_offset: int = -1
    size: int = 0
    max_broker_timestamp: int = -1
    batches: list[BatchInfo] = field(default_factory=list)
    max_timestamp: int = -1

    def __post_init__(self) -> None:
        if self.next_offset < 0:
            self.next_offset = self.first_offset

    def index_of(self, offset: int) -> int:
        """Index of the batch holding ``offset`` (first_offset <= offset < next_offset)."""
        return bisect_right(self.batches, offset, key=lambda b: b.base_offset) - 1


class MemoryPartition(FilelessPartition):
    """One partition's log in memory; thread-safe."""

    def __init__(self, location: str, config: LogConfig, clock: Callable[[], int]) -> None:
        self._location = location
        self._config = config
        self._clock = clock
        self._lock = threading.RLock()
        self._segments = [_Segment(0, clock())]
        self._log_start = 0
        self._closed = False
        self._state = MemoryKeyValues(self._check_open)

    @property
    def next_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def opened_next_offset(self) -> int:
        return 0

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return sum(segment.size for segment in self._segments)

    @property
    def state(self) -> MemoryKeyValues:
        return self._state

    def append(self, batch: Buffer, header: BatchHeader) -> int:
        check_append(batch, header)
        with self._lock:
            self._check_open()
            now = self._clock()
            segment = self._segments[-1]
            if segment.size > 0 and (
                segment.size + len(batch) > self._config.segment_bytes
                or now - segment.created_ms >= self._config.segment_ms
            ):
                segment = self._roll(now)
            base = segment.next_offset
            last = base + header.last_offset_delta
            stored = b"".join((base_offset_bytes(base), memoryview(batch)[BASE_OFFSET_END:]))
            segment.batches.append(BatchInfo(base, last, header.max_timestamp, now, stored))
            segment.next_offset = last + 1
            segment.size += len(batch)
            segment.max_broker_timestamp = now
            segment.max_timestamp = max(segment.max_timestamp, header.max_timestamp)
            return base

    def _roll(self, now: int) -> _Segment:
        segment = _Segment(self.next_offset, now)
        self._segments.append(segment)
        return segment

    def _position(self, offset: int) -> tuple[int, int] | None:
        """(segment index, batch index) of the batch holding ``offset``, or of the first
        batch after it; None past the end."""
        s = bisect_right(self._segments, offset, key=lambda seg: seg.first_offset) - 1
        s = max(s, 0)
        segment = self._segments[s]
        b = max(segment.index_of(offset), 0)
        while s < len(self._segments):
            batches = self._segments[s].batches
            while b < len(batches):
                if batches[b].last_offset >= offset:
                    return s, b
                b += 1
            s, b = s + 1, 0
        return None

    def _from(self, offset: int) -> Iterator[BatchInfo]:
        """The batches from the one holding ``offset`` (call with the lock held)."""
        found = self._position(offset)
        if found is None:
            return
        s, b = found
        for segment in self._segments[s:]:
            yield from segment.batches[b:]
            b = 0

    def read(self, offset: int, max_bytes: int) -> list[memoryview | FileRegion]:
        with self._lock:
            self._check_open()
            self._check_offset(offset)
            out: list[memoryview | FileRegion] = []
            taken = 0
            for info in self._from(offset):
                if out and taken + len(info.batch) > max_bytes:
                    break
                out.append(memoryview(info.batch))
                taken += len(info.batch)
            return out

    def _follow(self, offset: int) -> Iterator[BatchInfo]:
        """Batches from ``offset`` on, following appends made while iterating."""
        while True:
            with self._lock:
                if self._closed or offset < self._log_start or offset >= self.next_offset:
                    return
                found = self._position(offset)
                if found is None:
                    return
                info = self._segments[found[0]].batches[found[1]]
            yield info
            offset = info.last_offset + 1

    def find_first_batch_with_timestamp_at_least(self, timestamp: int,
                                                 from_offset: int = 0) -> BatchInfo | None:
        with self._lock:
            self._check_open()
            return next((info for info in self._from(max(self._log_start, from_offset))
                         if info.max_timestamp >= timestamp), None)

    def batch_with_max_timestamp(self, from_offset: int = 0) -> BatchInfo | None:
        with self._lock:
            self._check_open()
            best: BatchInfo | None = None
            for info in self._from(max(self._log_start, from_offset)):
                if best is None or info.max_timestamp > best.max_timestamp:
                    best = info
            return best

    def delete_records_before(self, offset: int) -> int:
        with self._lock:
            self._check_open()
            if offset < 0 or offset > self.next_offset:
                raise OffsetOutOfRange(
                    f"offset {offset} is outside [0, {self.next_offset}] of {self._location}")
            if offset <= self._log_start:
                return self._log_start
            self._log_start = offset
            self._roll_if_below(offset)
            self._drop(self._sealed_below(offset))
            return self._log_start

    def retention_due(self) -> RetentionCut | None:
        with self._lock:
            self._check_open()
            segments = [(s.first_offset, s.size, s.max_broker_timestamp)
                        for s in self._segments]
            return retention_cut(segments, self.next_offset, self._clock(), self._config)

    def drop_retained(self, cut: RetentionCut) -> int:
        with self._lock:
            self._check_open()
            self._roll_if_below(cut.keep_from)
            count = self._sealed_below(cut.keep_from)
            self._drop(count)
            return count

    def _roll_if_below(self, offset: int) -> None:
        """Roll when the open segment holds something and ends at or before ``offset``, so
        that a drop below ``offset`` takes it too (lock held)."""
        if self._segments[-1].size > 0 and self.next_offset <= offset:
            self._roll(self._clock())

    def sealed_segments(self) -> list[SealedSegment]:
        with self._lock:
            self._check_open()
            return [SealedSegment(s.first_offset, s.first_offset, s.next_offset, s.size,
                                  s.created_ms, s.max_broker_timestamp, s.max_timestamp)
                    for s in self._segments[:-1] if s.next_offset > self._log_start]

    def replace_segments(self, segments: Sequence[SealedSegment],
                         batches: Sequence[BatchInfo]) -> bool:
        check_cover(segments, batches)
        stored = [BatchInfo(info.base_offset, info.last_offset, info.max_timestamp,
                            info.broker_timestamp, bytes(info.batch)) for info in batches]
        with self._lock:
            self._check_open()
            sealed = self._segments[:-1]
            at = next((i for i, s in enumerate(sealed) if s.first_offset == segments[0].ident),
                      None)
            if at is None or at + len(segments) > len(sealed):
                return False
            old = sealed[at:at + len(segments)]
            if any((s.first_offset, s.next_offset, s.size)
                   != (given.ident, given.next_offset, given.size_bytes)
                   for s, given in zip(old, segments, strict=True)):
                return False
            merged = _Segment(old[0].first_offset, old[0].created_ms, old[-1].next_offset,
                              sum(len(info.batch) for info in stored),
                              max(s.max_broker_timestamp for s in old), stored,
                              max(s.max_timestamp for s in old))
            self._segments[at:at + len(segments)] = [merged]
            return True

    def _sealed_below(self, offset: int) -> int:
        """How many of the first sealed segments end at or before ``offset`` (lock held)."""
        count = 0
        while count < len(self._segments) - 1 and self._segments[count].next_offset <= offset:
            count += 1
        return count

    def _drop(self, count: int) -> None:
        del self._segments[:count]
        self._log_start = max(self._log_start, self._segments[0].first_offset)


class MemoryStorage(FilelessStorage[MemoryPartition]):
    """Every topic in memory; thread-safe."""

    def __init__(self, default_config: LogConfig, clock: Callable[[], int]) -> None:
        super().__init__()
        self._default_config = default_config
        self._clock = clock
        self._kv = MemoryKeyValues()
        self._cluster = SoloCluster(self.partition_keys)

    @property
    def default_config(self) -> LogConfig:
        return self._default_config

    @property
    def location(self) -> str:
        return URL

    def names_location(self, path: str) -> bool:
        return path == URL

    @property
    def cluster(self) -> SoloCluster:
        return self._cluster

    @property
    def kv(self) -> MemoryKeyValues:
        return self._kv

    def disk_usage(self) -> DiskUsage:
        return DiskUsage(-1, -1)  # no volume: DescribeLogDirs' "unknown"

    def _partitions(self, name: str, first: int, last: int,
                    config: LogConfig) -> list[MemoryPartition]:
        return [MemoryPartition(f"{URL}{name}/{p}", config, self._clock)
                for p in range(first, last)]

    def _store_topic(self, info: TopicInfo, config: LogConfig,
                     cap: TenantCap | None) -> list[MemoryPartition]:
        del cap  # one broker: its own count, under the engine's lock, is exact
        return self._partitions(info.name, 0, info.num_partitions, config)

    def _store_growth(self, name: str, current: int, new_total: int,
                      config: LogConfig, cap: TenantCap | None) -> list[MemoryPartition]:
        del cap  # one broker: its own count, under the engine's lock, is exact
        return self._partitions(name, current, new_total, config)

    def discard_created(self, *, at_close: bool = False) -> None:
        if not at_close:  # at close: close() drops nothing, the process is ending anyway
            self.close()
            with self._lock:
                self._topics.clear()


def open_memory_storage(url: str, default_config: LogConfig,
                        clock: Callable[[], int]) -> MemoryStorage:
    """A new, empty in-memory storage (``memory://``; anything after it is refused)."""
    if url.rstrip("/") != URL.rstrip("/"):
        raise ValueError(f"memory storage URL takes nothing after {URL!r}: {url!r}")
    return MemoryStorage(default_config, clock)
