"""Pages read ahead on ``postgres://`` (``broker_core/storage/pg_readahead.py``) stay true
to the stored rows when they change under the buffer: the log cleaner's swap of a
segment, once committed, keeps a window whose query ran before it from being served, and
a partition that was another broker's for a while (and cleaned there) serves what is
stored once it is back, not what was read ahead before it left. A read served old rows
after the cleaner raised its checkpoint would give read_committed consumers aborted
records with no aborted transaction listed for them. And a partition's key-value write
commits before a takeover that starts meanwhile. On a real PostgreSQL server."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

import psycopg
import pytest

from broker_core.codec.batch_header import base_offset, last_offset_delta, record_count
from broker_core.compaction.records import fillers
from broker_core.storage import LogConfig, PartitionStore, Storage, open_storage, pg_entries
from broker_core.storage.model import BatchInfo
from broker_core.storage.pg_partition import PgPartition
from broker_core.storage.pg_readahead import THREAD_NAME
from broker_core.storage.segments import SealedSegment
from tests.storage.pg_summaries import checked_storage
from tests.storage.test_storage_engines import TOPIC, append, partition
from tests.storage_helpers import batch_bytes

PAGE = 150
"""A fetch's byte limit: one batch of two records a page."""

P = ParamSpec("P")
R = TypeVar("R")


def _config() -> LogConfig:
    return LogConfig(segment_bytes=2000)  # 22 offsets of 12 batches in a sealed segment


@pytest.fixture
def storage() -> Iterator[Storage]:
    yield from checked_storage(_config(), TOPIC, 1)


class HeldReads:
    """Holds each read-ahead worker right after its query, the rows it got in hand,
    until ``release`` is set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.queried = threading.Event()
        self.release = threading.Event()
        monkeypatch.setattr(pg_entries, "rows_from", self._held(pg_entries.rows_from))

    def _held(self, real: Callable[P, R]) -> Callable[P, R]:
        def held(*args: P.args, **kwargs: P.kwargs) -> R:
            rows = real(*args, **kwargs)
            if threading.current_thread().name.startswith(THREAD_NAME):
                self.queried.set()
                assert self.release.wait(30), "the test never released the read-ahead"
            return rows
        return held


def _end(batch: bytes) -> int:
    """The offset after ``batch``."""
    return base_offset(batch) + last_offset_delta(batch) + 1


def _read_on(log: PartitionStore, offset: int) -> list[bytes]:
    """What a consumer fetching pages from ``offset`` to the end receives."""
    out: list[bytes] = []
    while offset < log.next_offset:
        page = [batch_bytes(c) for c in log.read(offset, PAGE)]
        assert page
        out += page
        offset = _end(page[-1])
    return out


def _stored(log: PartitionStore, offset: int) -> list[bytes]:
    """The batches the database holds from the one holding ``offset`` on."""
    return [bytes(info.batch) for info in log.batches_from(offset)]


def _shown(batches: list[bytes]) -> list[tuple[int, int, int]]:
    """(base offset, end, records) of each batch: what an assertion shows."""
    return [(base_offset(b), _end(b), record_count(b)) for b in batches]


def _emptied(segment: SealedSegment) -> list[BatchInfo]:
    """What a cleaning that removes every record of ``segment`` writes in its place."""
    return [BatchInfo(segment.first_offset, segment.next_offset - 1, -1, 0, batch)
            for batch in fillers(segment.first_offset, segment.next_offset)]


def _filled(log: PartitionStore) -> SealedSegment:
    """Twelve batches of two records; the sealed segment holding the first eleven."""
    for _ in range(12):
        append(log, 2)
    first = log.sealed_segments()[0]
    assert (first.first_offset, first.next_offset) == (0, 22)
    return first


def test_a_window_read_before_a_cleaners_swap_is_not_served_after_it(
        storage: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
    log = partition(storage)
    assert isinstance(log, PgPartition)
    segment = _filled(log)
    held = HeldReads(monkeypatch)
    with ThreadPoolExecutor(1) as fetcher:
        try:
            assert [_end(batch_bytes(c)) for c in log.read(0, PAGE)] == [2]  # ahead from 2
            assert held.queried.wait(30)  # the window's query ran: the rows before the swap
            reading = fetcher.submit(log.read, 2, PAGE)  # a fetch at 2 waits for it
            deadline = time.monotonic() + 30
            while log._ahead._window is not None:  # until the fetch has taken it
                assert time.monotonic() < deadline, "the fetch never waited for the window"
                time.sleep(0.01)
            assert log.replace_segments([segment], _emptied(segment))  # the cleaner
        finally:
            held.release.set()
        page = [batch_bytes(c) for c in reading.result(30)]
    stored = _stored(log, 2)  # the filler that covers offsets 0 to 21 first
    assert _shown(page) == _shown(stored[:1]) and page == stored[:1]
    consumed = page + _read_on(log, _end(page[-1]))
    assert _shown(consumed) == _shown(stored) and consumed == stored


def test_a_partition_back_from_another_owner_drops_what_it_read_ahead(
        storage: Storage) -> None:
    log = partition(storage)
    assert isinstance(log, PgPartition)
    _filled(log)
    url = storage.location
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT owner_epoch FROM edge_partitions").fetchone()
        assert row is not None
        epoch = int(row[0])
        log.fence(epoch)  # owned here
        log.read(0, PAGE)
        assert [_end(batch_bytes(c)) for c in log.read(2, PAGE)] == [4]  # from 4: buffered
        log.fence(None)  # moved to another broker, which cleans it
        conn.execute("UPDATE edge_partitions SET owner_epoch = %s", (epoch + 1,))
        other = open_storage(url, _config())
        try:
            theirs = partition(other)
            assert isinstance(theirs, PgPartition)
            theirs.fence(epoch + 1)
            segment = theirs.sealed_segments()[0]
            assert theirs.replace_segments([segment], _emptied(segment))
            theirs.fence(None)
        finally:
            other.close()
        conn.execute("UPDATE edge_partitions SET owner_epoch = %s", (epoch + 2,))
        log.fence(epoch + 2)  # and back here
    consumed, stored = _read_on(log, 4), _stored(log, 4)
    assert _shown(consumed) == _shown(stored) and consumed == stored


def test_a_partition_value_written_by_its_owner_commits_before_a_takeover(
        storage: Storage) -> None:
    """An owner's write of its partition's key-value area (producer snapshot, cleaner
    checkpoint) holds the partition's row against a claim until it commits: a takeover
    that starts meanwhile waits for it, so the new owner never has its own values
    overwritten by an owner paused past the takeover (a write held in the database here,
    by a trigger that sleeps inside its transaction)."""
    log = partition(storage)
    assert isinstance(log, PgPartition)
    url = storage.location
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT owner_epoch FROM edge_partitions").fetchone()
        assert row is not None
        epoch = int(row[0])
        log.fence(epoch)
        conn.execute("CREATE FUNCTION held() RETURNS trigger LANGUAGE plpgsql AS $$"
                     " BEGIN PERFORM pg_sleep(3); RETURN NEW; END $$")
        conn.execute("CREATE TRIGGER held AFTER INSERT OR UPDATE ON edge_partition_kv"
                     " FOR EACH ROW EXECUTE FUNCTION held()")
        with ThreadPoolExecutor(1) as owner:
            writing = owner.submit(log.state.put, "snapshot", b"old owner's")
            deadline = time.monotonic() + 30
            while conn.execute("SELECT 1 FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
                               " AND datname = current_database()").fetchone() is None:
                assert time.monotonic() < deadline and not writing.done(), writing
                time.sleep(0.01)
            # the claim of another broker, while the owner's write is held before commit
            conn.execute("UPDATE edge_partitions SET owner_epoch = %s", (epoch + 1,))
            # committed when the claim returned (the owner's thread may learn it later, on
            # a loaded machine: its future's state is no measure)
            seen = conn.execute("SELECT value FROM edge_partition_kv"
                                " WHERE key = 'snapshot'").fetchone()
            writing.result(30)
        assert seen is not None and bytes(seen[0]) == b"old owner's", \
            "the claim did not wait for the owner's write"
