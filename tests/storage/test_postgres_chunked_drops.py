"""On ``postgres://`` a drop (DeleteRecords, retention) moves the log start first, then
deletes the rows below it a bounded chunk per transaction without the partition's lock;
rows a crash left below the log start are deleted by the next retention round; and the
log cleaner's swap of a segment locks the partition's row only last, so the group commits
of other partitions (and of that one) never wait for its bulk work. Another session's
row lock on one entry row stands in for a long statement: the chunk or swap that needs
that row waits on it, observably. On a real PostgreSQL server."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import psycopg
import pytest

from broker_core.storage import (
    LogConfig,
    OffsetOutOfRange,
    Storage,
    open_storage,
    pg_entries,
    pg_segments,
)
from broker_core.storage.pg_database import Conn
from broker_core.storage.pg_partition import PgPartition
from tests.storage.pg_summaries import checked_storage
from tests.storage.test_postgres_readahead import _emptied, _filled, _shown, _stored
from tests.storage.test_postgres_speed import _lock_waits
from tests.storage.test_storage_engines import TOPIC, append, partition

T = TypeVar("T")

DELETING = "%DELETE FROM edge_entries%"
"""What a statement deleting entry rows looks like in ``pg_stat_activity``."""


def _config() -> LogConfig:
    return LogConfig(segment_bytes=2000)


@pytest.fixture
def storage() -> Iterator[Storage]:
    yield from checked_storage(_config(), TOPIC, 3)


def _pg(storage: Storage, index: int = 0) -> PgPartition:
    log = partition(storage, index=index)
    assert isinstance(log, PgPartition)
    return log


def _stored_rows(url: str, pid: int) -> tuple[int, int, int, int]:
    """(rows, their bytes, the row's size_bytes, the row's log start) as stored."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM edge_entries WHERE partition_id = %(p)s),"
            " (SELECT coalesce(sum(size), 0) FROM edge_entries WHERE partition_id = %(p)s),"
            " size_bytes, log_start FROM edge_partitions WHERE id = %(p)s",
            {"p": pid}).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2]), int(row[3])


def _below(url: str, pid: int, offset: int) -> int:
    """Rows stored wholly below ``offset``."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM edge_entries WHERE partition_id = %s"
                           " AND last_offset < %s", (pid, offset)).fetchone()
    assert row is not None
    return int(row[0])


def _many_rows(storage: Storage, rows: int) -> int:
    """Partition 0 filled with ``rows`` batches of five records (copies of one appended
    batch, written by SQL), reopened; its next offset."""
    log = _pg(storage)
    append(log, 5)
    with psycopg.connect(storage.location) as conn:
        conn.execute("INSERT INTO edge_entries SELECT partition_id, r * 5, r * 5 + 4,"
                     " r * 5 - mod(r * 5, 1000), broker_ts, max_ts, size, batch"
                     " FROM edge_entries, generate_series(1, %s - 1) r"
                     " WHERE partition_id = %s", (rows, log.partition_id))
        conn.execute("DELETE FROM edge_segments WHERE partition_id = %s", (log.partition_id,))
        conn.execute(pg_segments.SUMMARIZE.format(
            rows="(SELECT * FROM edge_entries WHERE partition_id = %s) AS rows"),
            (log.partition_id,))
        conn.execute("UPDATE edge_partitions SET next_offset = %(n)s, segment_base = %(n)s,"
                     " segment_size = 0, size_bytes = (SELECT sum(size) FROM edge_entries"
                     " WHERE partition_id = %(p)s) WHERE id = %(p)s",
                     {"n": rows * 5, "p": log.partition_id})
    storage.close()
    return rows * 5


def _waiting(url: str, running: Future[T]) -> set[tuple[int, object]]:
    """Once a statement deleting entry rows waits for a lock (while ``running`` runs):
    (backend, start) of it."""
    deadline = time.monotonic() + 30
    while not (found := _lock_waits(url, DELETING)):
        assert not running.done(), running.result()
        assert time.monotonic() < deadline, "no statement waited for the locked row"
        time.sleep(0.01)
    return set(found)


@contextmanager
def _entry_locked(url: str, pid: int, base: int) -> Iterator[psycopg.Connection[Any]]:
    """The entry row of ``pid`` at ``base`` locked by another session until the block
    ends: a statement deleting it waits."""
    with psycopg.connect(url) as locker:
        assert locker.execute("SELECT 1 FROM edge_entries WHERE partition_id = %s AND"
                              " base_offset = %s FOR UPDATE", (pid, base)).fetchone()
        yield locker


def test_a_drop_larger_than_a_chunk_commits_chunk_by_chunk(storage: Storage) -> None:
    url = storage.location
    rows = 2 * pg_entries.DELETE_ROWS + 500
    end = _many_rows(storage, rows)
    again = open_storage(url, _config())
    try:
        log = _pg(again)
        pid, cut = log.partition_id, end - 5
        locked_at = (pg_entries.DELETE_ROWS + 100) * 5  # in the second chunk
        with ThreadPoolExecutor(1) as pool, _entry_locked(url, pid, locked_at) as locker:
            dropping = pool.submit(log.delete_records_before, cut)
            waiting = _waiting(url, dropping)
            # while the second chunk waits: the log start has moved, the first chunk is
            # gone (committed), and the partition is served from its new log start
            stored, _, _, log_start = _stored_rows(url, pid)
            assert log_start == cut == log.log_start_offset
            assert stored == rows - pg_entries.DELETE_ROWS
            with pytest.raises(OffsetOutOfRange):
                log.read(locked_at, 1 << 20)
            assert len(log.read(cut, 1 << 20)) == 1
            append(log, 2)  # an append commits meanwhile
            assert waiting <= set(_lock_waits(url, DELETING)), "the chunk stopped waiting"
            locker.rollback()
            assert dropping.result(60) == cut
        stored, stored_bytes, size, log_start = _stored_rows(url, pid)
        assert (stored, log_start) == (2, cut)
        assert log.size_bytes == size == stored_bytes
        assert log.next_offset == end + 2
    finally:
        again.close()


def test_rows_a_crash_left_below_the_log_start_go_at_the_next_retention_round(
        storage: Storage) -> None:
    url = storage.location
    end = _many_rows(storage, 50)
    with psycopg.connect(url) as conn:  # the log start moved, the process died
        conn.execute("UPDATE edge_partitions SET log_start = 100 WHERE topic LIKE %s"
                     " AND partition = 0", (f"%{TOPIC}",))
    again = open_storage(url, _config())
    try:
        log = _pg(again)
        pid = log.partition_id
        assert _below(url, pid, 100) == 20
        with pytest.raises(OffsetOutOfRange):
            log.read(95, 1 << 20)  # never served
        again.enforce_retention()
        assert _below(url, pid, 100) == 0
        stored, stored_bytes, size, log_start = _stored_rows(url, pid)
        assert (stored, log_start) == (30, 100)
        assert log.size_bytes == size == stored_bytes
        assert (log.log_start_offset, log.next_offset) == (100, end)
        assert log.retention_due() is None  # swept: nothing due any more
    finally:
        again.close()


def test_two_drops_at_once_leave_no_row_below_the_log_start(storage: Storage) -> None:
    """Two DeleteRecords of one partition at once: the second's first chunk finds its rows
    being deleted by the first's (held by another session's lock), comes back empty, and
    the partition was marked swept while the first chunk's rows were still to be deleted
    (1,999 rows left below the log start for good, counted in its size, nothing due). Now
    it is swept only once no such row is left; else the next retention round deletes
    them."""
    url = storage.location
    end = _many_rows(storage, 4 * pg_entries.DELETE_ROWS)
    again = open_storage(url, _config())
    try:
        log = _pg(again)
        pid = log.partition_id
        with ThreadPoolExecutor(2) as pool, \
                _entry_locked(url, pid, (pg_entries.DELETE_ROWS + 100) * 5) as locker:
            first = pool.submit(log.delete_records_before, 3 * pg_entries.DELETE_ROWS * 5)
            waiting = _waiting(url, first)  # its second chunk waits for the locked row
            second = pool.submit(log.delete_records_before, end - 5)
            deadline = time.monotonic() + 30
            while len(set(_lock_waits(url, DELETING)) - waiting) < 1 and not second.done():
                assert time.monotonic() < deadline
                time.sleep(0.01)
            locker.rollback()
            assert first.result(60) >= 3 * pg_entries.DELETE_ROWS * 5
            assert second.result(60) == end - 5
        again.enforce_retention()  # what a drop may have left to the next round
        assert _below(url, pid, end - 5) == 0
        stored, stored_bytes, size, log_start = _stored_rows(url, pid)
        assert (stored, log_start) == (1, end - 5)
        assert log.size_bytes == size == stored_bytes
        assert log.retention_due() is None
    finally:
        again.close()


def test_a_cleaners_swap_holds_up_no_append_while_it_works(storage: Storage) -> None:
    url = storage.location
    cleaned, other = _pg(storage, 0), _pg(storage, 2)
    assert cleaned.partition_id % 2 == other.partition_id % 2  # one group-commit lane
    segment = _filled(cleaned)
    with ThreadPoolExecutor(3) as pool, \
            _entry_locked(url, cleaned.partition_id, 10) as locker:
        swapping = pool.submit(cleaned.replace_segments, [segment], _emptied(segment))
        waiting = _waiting(url, swapping)
        # while the swap's delete waits: appends to that partition and to another of its
        # lane are committed
        appended = [pool.submit(append, cleaned, 2), pool.submit(append, other, 2)]
        assert [done.result(60) for done in appended] == [24, 0]
        assert waiting <= set(_lock_waits(url, DELETING)), "the swap stopped waiting"
        locker.rollback()
        assert swapping.result(60)
    stored = _stored(cleaned, 0)
    assert _shown(stored)[:2] == [(0, 22, 0), (22, 24, 2)]
    assert _shown(stored)[-1] == (24, 26, 2)
    _, stored_bytes, size, _ = _stored_rows(url, cleaned.partition_id)
    assert cleaned.size_bytes == size == stored_bytes


def test_a_swap_the_log_start_overtook_rolls_back(storage: Storage) -> None:
    url = storage.location
    log = _pg(storage)
    segment = _filled(log)
    before = _stored(log, 0)
    with ThreadPoolExecutor(2) as pool, _entry_locked(url, log.partition_id, 10) as locker:
        swapping = pool.submit(log.replace_segments, [segment], _emptied(segment))
        _waiting(url, swapping)
        # the log start moves past rows of the swap's segment; its rows below go (or
        # wait for the swap: the swap then finds the log start moved at its end)
        dropping = pool.submit(log.delete_records_before, 4)
        while not dropping.done() and len(_lock_waits(url, DELETING)) < 2:
            time.sleep(0.01)
        locker.rollback()
        assert swapping.result(60) is False
        assert dropping.result(60) == 4
    assert _stored(log, 4) == before[2:]
    stored, stored_bytes, size, log_start = _stored_rows(url, log.partition_id)
    assert (stored, log_start) == (len(before) - 2, 4)
    assert log.size_bytes == size == stored_bytes


class _Explaining:
    """A connection that runs each statement under EXPLAIN ANALYZE instead, keeping its
    plan and answering no rows."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.plans: list[dict[str, Any]] = []

    def execute(self, query: str, params: Mapping[str, object],
                binary: bool = False) -> _Explaining:
        row = self.conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {query}", params).fetchone()
        assert row is not None
        self.plans.append(row[0][0]["Plan"])
        return self

    def fetchall(self) -> list[tuple[object, ...]]:
        return []


def _sorts(plan: dict[str, Any]) -> list[str]:
    """The sort method of each sort node of ``plan``."""
    found = [method for child in plan.get("Plans", []) for method in _sorts(child)]
    if plan["Node Type"] == "Sort":
        found.append(str(plan["Sort Method"]))
    return found


def test_a_fetch_sorts_only_the_rows_it_returns_whatever_the_plan(storage: Storage) -> None:
    """With index scans off (as statistics that underrate a partition may choose), a
    fetch's sort keeps only the rows its LIMIT takes (a top-N heap), not the rest of the
    partition (which, with millions of rows, spills to disk) for its running byte sum."""
    _many_rows(storage, 3000)
    reopened = open_storage(storage.location, _config())
    try:
        pid = _pg(reopened).partition_id
        with psycopg.connect(storage.location) as conn:
            conn.execute("SET enable_indexscan = off")
            conn.execute("SET enable_bitmapscan = off")
            explaining = _Explaining(conn)
            pg_entries.rows_from(cast(Conn, explaining), pid, 100, 20, 1 << 20)
    finally:
        reopened.close()
    (plan,) = explaining.plans
    sorts = _sorts(plan)
    assert sorts and set(sorts) == {"top-N heapsort"}, sorts
