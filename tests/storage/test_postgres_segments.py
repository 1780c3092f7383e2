"""On ``postgres://`` each segment's rows are summarised in ``edge_segments``
(``broker_core/storage/pg_segments.py``), kept by the statement that changes them: the
migration that adds the table summarises the rows already stored; lookups by time give
what a walk of every row gives, also once a drop took the rows whose timestamps a summary
counted; and retention, the cleaner's segment list and the lookups read the rows of one
segment at most, however many the partition holds. On a real PostgreSQL server."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg
import pytest

from broker_core.storage import LogConfig, Storage, open_storage, pg_entries, pg_segments
from broker_core.storage.model import BatchInfo
from broker_core.storage.pg_database import Conn
from broker_core.storage.pg_schema import SCHEMA_VERSION
from tests.postgres_server import shared_server
from tests.storage.pg_summaries import check_summaries, checked_storage
from tests.storage.test_postgres_chunked_drops import _many_rows, _pg
from tests.storage.test_postgres_speed import _lock_waits
from tests.storage.test_storage_engines import TOPIC, append, partition

T = TypeVar("T")


def _config() -> LogConfig:
    return LogConfig(segment_bytes=1000)


@pytest.fixture
def storage() -> Iterator[Storage]:
    yield from checked_storage(_config(), TOPIC, 1)


def _segments(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM edge_segments").fetchone()
    assert row is not None
    return int(row[0])


def test_the_migration_summarises_the_rows_already_stored(storage: Storage) -> None:
    """A database at the version before the summaries gets them from its rows."""
    assert SCHEMA_VERSION == 7
    log = partition(storage)
    for i in range(60):
        append(log, 3, first_timestamp=1_000 + i * 7)
    log.delete_records_before(40)
    url = storage.location
    storage.close()
    before = _segments(url)
    assert before > 5
    with psycopg.connect(url) as conn:
        conn.execute("DROP TABLE edge_segments")
        conn.execute("UPDATE edge_schema_version SET version = 6")
    again = open_storage(url, _config())
    try:
        assert _segments(url) == before
        check_summaries(url)
        assert partition(again).sealed_segments()[0].first_offset == 39
    finally:
        again.close()


def _walk(log_start: int, batches: list[BatchInfo], chosen: Callable[[BatchInfo], bool],
          ) -> BatchInfo | None:
    return next((b for b in batches if b.last_offset >= log_start and chosen(b)), None)


def _at_least(stamp: int) -> Callable[[BatchInfo], bool]:
    return lambda info: info.max_timestamp >= stamp


def test_lookups_by_time_give_what_a_walk_of_every_row_gives(storage: Storage) -> None:
    """Timestamps out of order across segments, and drops that take a segment's oldest
    rows with the timestamp its summary still counts: each lookup answers as a walk."""
    rng = random.Random(7)
    log = partition(storage)
    for _ in range(80):
        append(log, rng.randint(1, 4), first_timestamp=rng.randrange(1_000, 100_000))
    # the oldest rows of a segment hold the partition's largest timestamp: dropped, the
    # summary's maximum is out of date (a bound), and lookups must look further
    at = append(log, 1, first_timestamp=500_000)
    for _ in range(10):
        append(log, 2, first_timestamp=rng.randrange(1_000, 100_000))
    for drop_to in (37, at + 1):
        log.delete_records_before(drop_to)
        stored = list(log.batches_from(log.log_start_offset))
        start = log.log_start_offset
        best = max(stored, key=lambda b: (b.max_timestamp, -b.base_offset))
        found = log.batch_with_max_timestamp()
        assert found is not None and found.base_offset == best.base_offset
        for stamp in [0, 999, 50_000, 99_999, 100_000, 499_999, 500_000, 500_001,
                      *(rng.randrange(1_000, 100_000) for _ in range(30))]:
            want = _walk(start, stored, _at_least(stamp))
            got = log.find_first_batch_with_timestamp_at_least(stamp)
            assert (got and got.base_offset) == (want and want.base_offset), stamp


def _entry_rows_read(url: str, run: Callable[[Conn], T]) -> tuple[T, int]:
    """What ``run`` returns on a connection of its own, and how many rows of
    ``edge_entries`` (table rows a scan read, and index entries) its statements read
    (PostgreSQL's counters of the transaction)."""
    with psycopg.connect(url) as conn:
        found = run(conn)
        row = conn.execute(
            "SELECT pg_stat_get_xact_tuples_returned('edge_entries'::regclass)"
            " + pg_stat_get_xact_tuples_returned('edge_entries_pkey'::regclass)").fetchone()
    assert row is not None
    return found, int(row[0])


SEGMENT_ROWS = 200
"""Rows of each segment ``_many_rows`` writes (base offsets step by 5, segments by 1000)."""


def test_retention_the_cleaner_and_lookups_read_one_segment_of_rows_at_most(
        storage: Storage) -> None:
    """6,000 rows in 30 segments: each reader reads at most one segment's rows (the
    rows they summarise are not read again), also with rows below the log start left."""
    end = _many_rows(storage, 6_000)
    url = storage.location
    reopened = open_storage(url, _config())
    try:
        log = _pg(reopened)
        pid = log.partition_id
        with psycopg.connect(url) as conn:  # times rising with the offsets, summarised
            conn.execute("UPDATE edge_entries SET max_ts = max_ts + base_offset")
            conn.execute("DELETE FROM edge_segments")
            conn.execute(pg_segments.SUMMARIZE.format(rows="edge_entries"))
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM edge_entries")  # the updated rows' old versions go
        segments, read = _entry_rows_read(url, lambda c: pg_segments.summaries(c, pid, 0, end))
        assert len(segments) == 30 and read == 0
        newest = segments[-1].max_timestamp
        # the summaries have no statistics yet (as after a migration): still one row read
        # for a time before the first record, not one per segment
        found, read = _entry_rows_read(url, lambda c: pg_entries.first_at_least(c, pid, 0, 0))
        assert found is not None and found.base_offset == 0
        assert read <= 2, read
        found, read = _entry_rows_read(url, lambda c: pg_entries.first_at_least(c, pid, 0,
                                                                               newest))
        assert found is not None and found.base_offset == end - 5
        assert read <= SEGMENT_ROWS + 1, read
        found, read = _entry_rows_read(url, lambda c: pg_entries.with_max_timestamp(c, pid, 0))
        assert found is not None and found.base_offset == end - 5
        assert read <= SEGMENT_ROWS + 1, read
        # the log start moved into the 11th segment, its rows below not yet deleted
        with psycopg.connect(url) as conn:
            conn.execute("UPDATE edge_partitions SET log_start = 10500 WHERE id = %s", (pid,))
        segments, read = _entry_rows_read(
            url, lambda c: pg_segments.summaries(c, pid, 10_500, end))
        assert (segments[0].ident, segments[0].first_offset) == (10_000, 10_500)
        assert segments[0].size_bytes == segments[1].size_bytes // 2
        assert read <= SEGMENT_ROWS + 2, read
    finally:
        reopened.close()


def test_the_storage_compiles_no_statement(storage: Storage) -> None:
    """JIT is off on the storage's connections: the lateral join of the summaries costs
    enough in the planner's eyes to be compiled (30-200 ms) to run in a millisecond."""
    with _pg(storage)._db.autocommit() as conn:
        assert conn.execute("SHOW jit").fetchone() == ("off",)


def test_a_swap_of_a_segment_with_rows_left_below_the_log_start_keeps_them_summarised(
        storage: Storage) -> None:
    """The cleaner replaces a segment whose oldest rows are below the log start and not
    yet deleted (a drop cut short): its swap deletes and rewrites the rows from the log
    start on, the rows below stay summarised with them, and the sweep that deletes them
    later takes them out."""
    log = partition(storage)
    for i in range(30):
        append(log, 3, first_timestamp=1_000 + i)
    url = storage.location
    first = log.sealed_segments()[1]
    start = first.first_offset + 4  # inside the segment's second batch
    storage.close()
    with psycopg.connect(url) as conn:  # the log start moved, the sweep never ran
        conn.execute("UPDATE edge_partitions SET log_start = %s", (start,))
    again = open_storage(url, _config())
    try:
        log = partition(again)
        segments = log.sealed_segments()[:2]
        assert segments[0].ident == first.ident
        assert first.first_offset < segments[0].first_offset <= start
        assert segments[0].size_bytes < first.size_bytes
        batches = [info for info in log.batches_from(start)
                   if info.base_offset < segments[-1].next_offset]
        assert log.replace_segments(segments, batches)
        check_summaries(url)
        assert log.delete_records_before(start) == start  # sweeps what is below
        check_summaries(url)
        assert log.sealed_segments()[0].first_offset == segments[0].first_offset
    finally:
        again.close()


def test_a_drop_into_the_open_segment_and_an_append_meanwhile_both_finish(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """DeleteRecords into the segment appends go to, an append committed between the
    drop's DELETE of a chunk and the end of its transaction: the chunk takes the
    segment's summary only after the partition's row, as a group commit does, so the
    append does not wait for the drop while the drop waits for it (PostgreSQL's deadlock
    detector would fail one of them after a second)."""
    url = shared_server().new_database_url()
    storage = open_storage(url, LogConfig())  # one segment: the open one
    storage.create_topic(TOPIC, 1, {})
    pool = ThreadPoolExecutor(1)
    try:
        log = _pg(storage)
        for _ in range(10):
            append(log, 3)
        delete_chunk = pg_entries.delete_chunk
        appended: list[Future[int]] = []

        def chunk_then_append(conn: Conn, pid: int, low: int, high: int,
                              **options: Any) -> list[pg_segments.Deleted]:
            chunk = delete_chunk(conn, pid, low, high, **options)
            if chunk and not appended:  # an append commits now, or waits for a lock
                appended.append(pool.submit(append, log, 3))
                deadline = time.monotonic() + 30
                while not appended[0].done() and not _lock_waits(url):
                    assert time.monotonic() < deadline, "the append neither ended nor waited"
                    time.sleep(0.01)
            return chunk

        monkeypatch.setattr(pg_entries, "delete_chunk", chunk_then_append)
        assert log.delete_records_before(16) == 16
        assert appended and appended[0].result(30) == 30
    finally:
        pool.shutdown(wait=True)
        storage.close()
    check_summaries(url)


def test_a_swap_read_before_the_log_start_moved_again_is_refused(storage: Storage) -> None:
    """The cleaner read a segment, then the log start moved past its first batches (their
    rows not yet deleted): the swap is refused (it would reinsert the batches from the
    new log start only, a hole below it that the summary cannot describe), and the next
    round, reading afresh, swaps."""
    log = partition(storage)
    for i in range(30):
        append(log, 3, first_timestamp=1_000 + i)
    url = storage.location
    first = log.sealed_segments()[1].first_offset
    storage.close()

    def moved_to(start: int) -> Storage:  # the log start moved, the sweep not yet run
        with psycopg.connect(url) as conn:
            conn.execute("UPDATE edge_partitions SET log_start = %s", (start,))
        return open_storage(url, _config())

    again = moved_to(first + 4)
    segments = partition(again).sealed_segments()[:1]
    batches = [info for info in partition(again).batches_from(first + 4)
               if info.base_offset < segments[0].next_offset]
    again.close()
    again = moved_to(first + 7)
    try:
        log = partition(again)
        assert not log.replace_segments(segments, batches)
        check_summaries(url)
        segments = log.sealed_segments()[:1]
        batches = [info for info in log.batches_from(first + 7)
                   if info.base_offset < segments[0].next_offset]
        assert log.replace_segments(segments, batches)
        assert log.delete_records_before(first + 7) == first + 7
        check_summaries(url)
    finally:
        again.close()
