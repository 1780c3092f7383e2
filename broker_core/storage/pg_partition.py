"""One partition's log in PostgreSQL (:class:`PgPartition`), its row's state cached.

Each record batch is one row of ``edge_entries`` keyed by (partition, base offset), with
its last offset, broker timestamp and max timestamp, so a fetch reads only the rows from
the offset asked for (and only as many as fit in its byte limit). Rows carry the segment
they belong to (rolled by ``segment.bytes`` / ``segment.ms`` as on files), so retention
drops whole segments by the same rule as the other engines.

Retention and DeleteRecords move the log start first, in one short statement (a read
below it answers OFFSET_OUT_OF_RANGE from then on), then delete the rows below it a
bounded chunk per transaction, the partition's lock not held while the database works
(:meth:`PgPartition._sweep`); rows a crash leaves below the log start are never served,
and the next retention round deletes them.

Appends are group-committed (``pg_commits``): an append takes the next offsets of the
partition's *assigned* end at once and queues; a worker thread commits everything
queued from the partitions of its lane (two lanes side by side) in one transaction that
inserts the rows and moves each partition row's ``next_offset``, conditioned on the
offset expected and on the owner's epoch. Only then do the partition's *committed* end
(``next_offset``, the high watermark) move and its producers get their answer:
acknowledged means committed, and a fetch never sees an offset before its commit. On the
event loop ``append_deferred`` returns the offset and a future (the produce path awaits it
as it awaits the file engine's fsync); ``append`` waits for the commit itself.

Rebuilding a partition's producer state reads only the headers of its data batches
(:meth:`PgPartition.headers_from`): the records stay in the database.

Any broker reads a partition newest first as its owner committed it
(:meth:`PgPartition.search`): a partition leader finds there the durable state of a
transaction that another broker coordinates.

A database error raises :class:`DatabaseUnavailable` (an OSError: clients get retriable
errors); the partition then fails the appends queued behind the failed one and reloads its
row before its next write (and before its producer state is rebuilt), so a commit whose
outcome was lost neither duplicates nor skips offsets.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

from broker_core.codec.batch_header import BatchHeader, check_append, same_batch, set_base_offset
from broker_core.codec.varints import Buffer as BatchBytes

from . import pg_entries, pg_segments
from .cluster import NotOwner
from .config import LogConfig
from .errors import AppendAbandoned, DatabaseUnavailable, LogClosed, OffsetOutOfRange
from .fileless import FilelessPartition
from .model import BatchInfo
from .pg_commits import GroupCommitter, Pending, Ticket
from .pg_database import Conn, Database
from .pg_entries import ENTRY_COLUMNS, HEADER_COLUMNS
from .pg_kv import PgKeyValues
from .pg_readahead import Buffer, ReadAhead
from .protocols import RowReader
from .region import FileRegion
from .retention import RetentionCut, retention_cut
from .segments import SealedSegment, check_cover

_CHUNK = 64
"""Rows per query when reading forward."""
_FOLLOW_BYTES = 1 << 20
"""Batch bytes per query when following whole batches (``batches_from``: the cleaner,
ListOffsets, the system topics), beyond the first batch, which always comes: a reader that
stops early holds at most this much more than it used, not ``_CHUNK`` batches of any size.
A read of headers alone has no such bound (61 bytes a row leave the server)."""

T = TypeVar("T")

_DRAIN_TIMEOUT_S = 30.0
"""Longest a reload of a partition's row waits for its queued appends to be answered."""


class _Again(Exception):
    """A search that asked for more reads than it was allowed: run it in a snapshot."""


class _Reads:
    """``pg_entries.rows_newest`` on one connection, at most ``allowed`` times (None: no
    bound; past it, :class:`_Again`)."""

    def __init__(self, conn: Conn, pid: int, allowed: int | None) -> None:
        self._conn = conn
        self._pid = pid
        self._left = allowed

    def read(self, since: int, before: int | None, also: int | None,
             limit: int) -> list[BatchInfo]:
        if self._left is not None:
            if self._left == 0:
                raise _Again
            self._left -= 1
        return pg_entries.rows_newest(self._conn, self._pid, since, before, also, limit)


class PgPartition(FilelessPartition):
    """One partition's log in PostgreSQL, its row's state cached; thread-safe."""

    drops_in_thread = True  # statements; a read the log start overtakes answers OFFSET_OUT_OF_RANGE

    def __init__(self, db: Database, workers: tuple[GroupCommitter, ReadAhead], pid: int,
                 location: str, config: LogConfig, clock: Callable[[], int],
                 row: tuple[object, ...] | None = None,
                 fenced: Callable[[], bool] = lambda: True) -> None:
        self._db = db
        self._committer, readahead = workers
        self._ahead = Buffer(readahead, lambda offset, size: self._page(offset, size, None))
        self._fenced = fenced
        self._id = pid
        self._location = location
        self._config = config
        self._clock = clock
        self._lock = threading.RLock()
        self._drained = threading.Condition(self._lock)
        self._closed = False
        self._stale = row is None
        self._loaded = 0
        """Counts reloads of the cached row (``_shrink``)."""
        self._swept = -1
        """The log start below which every row is known deleted (-1: not known)."""
        self._generation = 0
        """Moves on whenever the cached row goes stale: appends queued at an older one fail."""
        self._inflight = 0
        """Appends queued for a group commit and not yet answered."""
        self._log_start = self._next = self._assigned = self._size = self._owner_epoch = 0
        self._segment = (0, 0, clock())  # base offset, size, created ms (of the assigned end)
        if row is not None:
            self._load(row)
        self._opened_next = self._next
        self._epoch: int | None = None
        """The ownership epoch this broker writes at; None: not owned here."""
        self._state = PgKeyValues(db, pid, self._check_open, self._owned_epoch,
                                  self._check_current)

    _ROW = ("log_start, next_offset, size_bytes, segment_base, segment_size,"
            " segment_created_ms, owner_epoch")

    def _load(self, row: tuple[object, ...]) -> None:
        """Take the stored row as the cached one (lock held, nothing in flight)."""
        values = [int(str(v)) for v in row]
        self._log_start, self._next, self._size = values[0], values[1], values[2]
        self._assigned = self._next
        self._segment = (values[3], values[4], values[5])
        self._owner_epoch = values[6]
        self._stale = False
        self._loaded += 1

    def _check_current(self) -> None:
        """Open, and the cached row reloaded if stale (before a read of the key-value
        area): the producer state is rebuilt (its snapshot read first) against what is
        stored, so a commit whose reply was lost counts (a retry of its batch is a
        duplicate)."""
        with self._lock:
            self._check_open()
            with contextlib.suppress(NotOwner):  # reloaded all the same
                self._refresh()

    def _spoil(self) -> None:
        """The cached row may be wrong: reload it before the next write, and fail the
        appends still queued (lock held)."""
        self._stale = True
        self._generation += 1
        self._assigned = self._next

    def settle(self) -> None:
        with self._lock:
            self._check_open()
            self._drain()
            with contextlib.suppress(NotOwner):  # reloaded all the same
                self._refresh()

    def _drain(self) -> None:
        """Wait until every queued append of this partition is answered (lock held)."""
        if self._inflight and not self._drained.wait_for(lambda: not self._inflight,
                                                         _DRAIN_TIMEOUT_S):
            raise DatabaseUnavailable(errno.ETIMEDOUT,
                                      f"appends to {self._location} wait for a commit")

    def _refresh(self) -> None:
        """Reload the partition row after a failed statement (lock held)."""
        if self._stale:
            self._drain()
            with self._db.autocommit() as conn:
                row = conn.execute(f"SELECT {self._ROW} FROM edge_partitions WHERE id = %s",
                                   (self._id,)).fetchone()
            if row is None:
                self._closed = True
                raise LogClosed(f"partition {self._location} is gone")
            self._load(row)
            if self._epoch is not None and self._owner_epoch != self._epoch:
                self._epoch = None  # taken over while this broker was away
                raise NotOwner(f"partition {self._location} was taken over")

    @property
    def partition_id(self) -> int:
        """The partition row's key."""
        return self._id

    def fence(self, epoch: int | None) -> int | None:
        """Write at ``epoch`` from now on (None: write nothing more); return the epoch held
        before. Taking a partition reloads its row now (the previous owner moved it on:
        reads and the state rebuilt from it must see that), or raises; giving it up marks
        the row for a reload. Either way the pages read ahead are dropped: while the
        partition was another broker's, its cleaner may have replaced the rows."""
        with self._lock:
            before, self._epoch = self._epoch, epoch
            self._spoil()
            self._swept = -1  # another owner's drop may have stopped halfway
            self._ahead.drop()
            if epoch is not None:
                self._refresh()
            return before

    def _owned_epoch(self) -> int | None:
        """The epoch held, or NotOwner; None when the storage is used outside a cluster
        (no broker registered through it: a tool or a test), where writes are unfenced."""
        epoch = self._epoch
        if epoch is None and self._fenced():
            raise NotOwner(f"partition {self._location} is not owned by this broker")
        return epoch

    @property
    def next_offset(self) -> int:
        return self._next

    @property
    def opened_next_offset(self) -> int:
        return self._opened_next

    @property
    def size_bytes(self) -> int:
        return self._size

    @property
    def state(self) -> PgKeyValues:
        return self._state

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def epoch(self) -> int | None:
        return self._epoch

    @contextmanager
    def _writing(self) -> Iterator[Conn]:
        """A transaction of a write; on failure the cached row is reloaded before the next
        (the lock is taken for that, if not held)."""
        try:
            with self._db.tx() as conn:
                yield conn
        except BaseException:
            with self._lock:
                self._spoil()
            raise

    def _queue(self, given: BatchBytes, header: BatchHeader, ticket: Ticket,
               generation: int | None = None) -> int:
        """Give the batch ``given`` the next offsets and queue it for the group commit
        (refused if ``generation`` is given and is no longer the partition's); a batch that
        is not a ``bytearray`` is copied first (it may be the request's bytes)."""
        check_append(given, header)
        batch = given if isinstance(given, bytearray) else bytearray(given)
        with self._lock:
            self._check_open()
            epoch = self._owned_epoch()  # first: a partition given up answers NotOwner
            if generation is not None and generation != self._generation:
                raise AppendAbandoned(errno.ESTALE, "an earlier write to the partition "
                                      "failed after this batch was checked")
            self._refresh()
            now = self._clock()
            seg_base, seg_size, seg_created = self._segment
            if seg_size > 0 and (seg_size + len(batch) > self._config.segment_bytes
                                 or now - seg_created >= self._config.segment_ms):
                seg_base, seg_size, seg_created = self._assigned, 0, now
            base = self._assigned
            set_base_offset(batch, base)
            last = base + header.last_offset_delta
            segment = (seg_base, seg_size + len(batch), seg_created)
            self._committer.submit(Pending(self, self._generation, epoch, base, last, segment,
                                           now, header.max_timestamp, batch, ticket))
            self._assigned = last + 1
            self._segment = segment
            self._inflight += 1
            return base

    def append(self, batch: BatchBytes, header: BatchHeader) -> int:
        """Append and wait for the commit (the group commit of whatever else waits too)."""
        ticket = Ticket(None)
        base = self._queue(batch, header, ticket)
        try:
            ticket.wait()
        except DatabaseUnavailable as exc:
            if exc.errno == errno.ESTALE:
                with self._lock:
                    self._refresh()  # NotOwner when another broker took the partition
            raise
        return base

    def holds(self, base: int, batch: BatchBytes) -> bool:
        """Compared as ``same_batch`` does (a LogAppendTime topic's batch is stamped)."""
        with self._lock:
            self._check_open()
        with self._db.autocommit() as conn:
            row = conn.execute("SELECT batch FROM edge_entries WHERE partition_id = %s"
                               " AND base_offset = %s", (self._id, base),
                               binary=True).fetchone()
        if row is None:
            return False
        stored = row[0]
        assert isinstance(stored, bytes | bytearray | memoryview)
        return same_batch(stored, batch)

    def append_deferred(self, batch: BatchBytes, header: BatchHeader,
                        generation: int | None = None) -> tuple[int, asyncio.Future[None]]:
        """From the event loop: the base offset at once, and a future done once the batch
        is committed (failed with DatabaseUnavailable when it was not)."""
        ticket = Ticket(asyncio.get_running_loop())
        base = self._queue(batch, header, ticket, generation)
        assert ticket.future is not None
        return base, ticket.future

    def committed(self, appends: list[Pending]) -> None:
        with self._lock:
            self._next = appends[-1].last + 1
            self._size += sum(len(p.batch) for p in appends)
            self._settled(len(appends))

    def failed(self, appends: list[Pending], error: OSError) -> None:
        with self._lock:
            if appends[0].generation == self._generation:
                self._spoil()
            self._settled(len(appends))

    def _settled(self, count: int) -> None:
        self._inflight -= count
        if not self._inflight:
            self._drained.notify_all()

    def read(self, offset: int, max_bytes: int) -> list[memoryview | FileRegion]:
        with self._lock:
            self._check_open()
            self._check_offset(offset)
            end = self._next
        page = self._ahead.take(offset, max_bytes)
        if page is None:
            page = self._page(offset, max_bytes, end)
        with self._lock:  # a drop in a worker thread (``drops_in_thread``) overtook the
            self._check_offset(offset)  # read: its rows may be gone (a gap), not served
        if page:  # a consumer behind the end: read on (``pg_readahead``)
            self._ahead.follow(page[-1].last_offset + 1, end, max_bytes)
        return [memoryview(info.batch) for info in page]

    def _page(self, offset: int, max_bytes: int, end: int | None) -> list[BatchInfo]:
        """The batches from the one holding ``offset`` up to ``max_bytes`` (the first
        whole), below ``end`` (default: the committed end)."""
        if end is None:
            with self._lock:
                self._check_open()
                end = self._next
        out: list[BatchInfo] = []
        taken = 0
        with self._db.autocommit() as conn:
            while offset < end:
                rows = pg_entries.rows_from(conn, self._id, offset, _CHUNK, max_bytes - taken)
                for info in rows:
                    if info.base_offset >= end or (out and taken + len(info.batch) > max_bytes):
                        return out
                    out.append(info)
                    taken += len(info.batch)
                    offset = info.last_offset + 1
                if len(rows) < _CHUNK:
                    break
        return out

    def close(self) -> None:
        super().close()
        self._ahead.drop()

    def headers_from(self, offset: int) -> Iterator[BatchInfo]:
        """Only the headers of batches other than control batches leave the server."""
        with self._lock:
            self._check_open()
            self._check_offset(offset)
        return self._follow(offset, HEADER_COLUMNS, None)

    def _follow(self, offset: int, columns: str = ENTRY_COLUMNS,
                max_bytes: int | None = _FOLLOW_BYTES) -> Iterator[BatchInfo]:
        """Batches from ``offset`` on, following appends made while iterating: each query
        up to ``_CHUNK`` rows and ``max_bytes`` of batches (the first row whatever its
        size)."""
        while not self._closed and self._log_start <= offset < self._next:
            with self._db.autocommit() as conn:
                rows = pg_entries.rows_from(conn, self._id, offset, _CHUNK, max_bytes,
                                            columns=columns)
            if not rows:
                return
            for info in rows:
                yield info
                offset = info.last_offset + 1

    def search(self, plan: Callable[[RowReader], T]) -> T:
        """Run ``plan`` with one statement in autocommit (one round trip: what is sought
        is usually in the newest rows); if it reads again, once more in one REPEATABLE
        READ transaction, so that the rows a compaction writes and deletes meanwhile (in
        one transaction each) are seen all or not at all, however many reads it makes.
        The cached row plays no part (on a broker that does not own the partition it lags
        what the owner committed)."""
        with self._lock:
            self._check_open()
        try:
            with self._db.autocommit() as conn:
                return plan(_Reads(conn, self._id, 1).read)
        except _Again:
            pass
        with self._snapshot() as conn:
            return plan(_Reads(conn, self._id, None).read)

    def _log_start_now(self) -> int:
        with self._lock:
            self._check_open()
            return self._log_start

    @contextmanager
    def _snapshot(self) -> Iterator[Conn]:
        """A read-only transaction whose statements see one snapshot: a lookup by time
        reads the summaries, then one segment's rows or more, and a cleaner's swap
        between them could move the rows sought out of sight."""
        with self._db.tx() as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield conn

    def find_first_batch_with_timestamp_at_least(self, timestamp: int,
                                                 from_offset: int = 0) -> BatchInfo | None:
        start = max(self._log_start_now(), from_offset)
        with self._snapshot() as conn:
            return pg_entries.first_at_least(conn, self._id, start, timestamp)

    def batch_with_max_timestamp(self, from_offset: int = 0) -> BatchInfo | None:
        start = max(self._log_start_now(), from_offset)
        with self._snapshot() as conn:
            return pg_entries.with_max_timestamp(conn, self._id, start)

    def delete_records_before(self, offset: int) -> int:
        with self._lock:
            self._check_open()
            self._refresh()
            self._drain()
            if offset < 0 or offset > self._next:
                raise OffsetOutOfRange(
                    f"offset {offset} is outside [0, {self._next}] of {self._location}")
            if offset > self._log_start:
                self._move_start(offset, self._segment_kept(offset))
            log_start = self._log_start
        self._sweep()
        return log_start

    def _segment_kept(self, offset: int) -> tuple[int, int, int]:
        """The segment appends go to once everything below ``offset`` is dropped: a new
        empty one at the next offset when the open one holds something and ends at or
        before ``offset`` (it goes too), else the open one (lock held, drained)."""
        segment = self._segment
        if segment[1] > 0 and self._next <= offset:
            return self._next, 0, self._clock()
        return segment

    def _move_start(self, log_start: int, segment: tuple[int, int, int]) -> None:
        """Move the log start to ``log_start`` (and the open segment to ``segment``) in one
        short statement, fenced by the epoch (lock held, nothing in flight): a read below
        it answers OFFSET_OUT_OF_RANGE from now on. The rows below it stay until
        :meth:`_sweep` deletes them."""
        epoch = self._owned_epoch()
        with self._writing() as conn:
            if conn.execute(
                    "UPDATE edge_partitions SET log_start = %(s)s, segment_base = %(b)s,"
                    " segment_size = %(z)s, segment_created_ms = %(c)s WHERE id = %(p)s"
                    " AND owner_epoch = coalesce(%(e)s, owner_epoch) RETURNING 1",
                    {"s": log_start, "p": self._id, "b": segment[0], "z": segment[1],
                     "c": segment[2], "e": epoch}).fetchone() is None:
                raise NotOwner(f"partition {self._location} was taken over")
        self._log_start, self._segment = log_start, segment

    def _sweep(self) -> None:
        """Delete the rows wholly below the log start, a bounded chunk per transaction
        (``pg_entries.delete_chunk``), the partition's lock not held while the database
        works: each chunk's transaction subtracts what it deleted from the row's size,
        checking the epoch last. Rows left below the log start (a crash, a failed chunk)
        are deleted by the next drop or retention round (``retention_due`` reports them).
        The partition counts as swept only once a fresh look finds no row left below the
        log start: a chunk comes back empty, too, when another sweep (or the cleaner's
        swap) had its rows locked, and that one may have left rows or rolled back."""
        low = 0
        while True:
            with self._lock:
                self._check_open()
                epoch = self._owned_epoch()
                log_start, loaded = self._log_start, self._loaded
                if self._swept >= log_start:
                    return
            with self._writing() as conn:
                chunk = pg_entries.delete_chunk(conn, self._id, low, log_start,
                                                last_below=log_start)
                if not chunk and pg_entries.any_below(conn, self._id, log_start):
                    return  # not swept: the next retention round looks again
                deleted = sum(gone.size_bytes for gone in chunk)
                if chunk and conn.execute(
                        "UPDATE edge_partitions SET size_bytes = size_bytes - %s"
                        " WHERE id = %s AND owner_epoch = coalesce(%s, owner_epoch)"
                        " RETURNING 1", (deleted, self._id, epoch)).fetchone() is None:
                    raise NotOwner(f"partition {self._location} was taken over")
                pg_segments.take(conn, self._id, chunk)
            with self._lock:
                if not chunk:
                    self._swept = max(self._swept, log_start)
                    return
                self._shrink(loaded, deleted)
            low = chunk[-1].next_offset

    def _shrink(self, loaded: int, reclaimed: int) -> None:
        """``reclaimed`` bytes were deleted from the stored row's size (lock held): the
        cached size follows unless the row was (or is to be) reloaded since ``loaded``."""
        if self._loaded == loaded and not self._stale:
            self._size -= reclaimed

    def sealed_segments(self) -> list[SealedSegment]:
        """The committed rows of every segment before the one appends go to, by segment."""
        with self._lock:
            self._check_open()
            active, start = self._segment[0], self._log_start
        with self._db.autocommit() as conn:
            return pg_segments.summaries(conn, self._id, start, active)

    def replace_segments(self, segments: Sequence[SealedSegment],
                         batches: Sequence[BatchInfo]) -> bool:
        """Delete the segments' rows and insert ``batches`` (as rows of the first segment)
        in one transaction, only while this broker owns the partition at its epoch and the
        rows and the log start are still as given (``pg_entries.swap_segments``: the
        partition's row is locked only at its end)."""
        check_cover(segments, batches)
        with self._lock:
            self._check_open()
            epoch, loaded = self._owned_epoch(), self._loaded
        try:
            with self._db.tx() as conn:
                reclaimed = pg_entries.swap_segments(conn, self._id, epoch, segments, batches)
        except pg_entries.SwapRefused:
            return False
        finally:  # committed, or maybe (its answer lost): rows read ahead may be the old ones
            self._ahead.drop()
        with self._lock:
            self._shrink(loaded, reclaimed)
        return True

    def retention_due(self) -> RetentionCut | None:
        """What retention drops, from the segments' summaries (``pg_segments``: sizes and
        newest broker timestamps; none when the partition has no sealed segment and its
        open one cannot be due yet, or is another broker's to write); the lock is not held
        meanwhile. Rows not yet known to be deleted below the log start (since this broker
        took the partition) are due too."""
        with self._lock:
            self._check_open()
            if self._epoch is None and self._fenced():
                return None  # its owner enforces it
            (active, open_size, created), start, end = self._segment, self._log_start, self._next
            swept = self._swept >= start
        now, config = self._clock(), self._config
        cut = None
        if active > start or (open_size > 0 and (
                config.retention_bytes == 0
                or 0 <= config.retention_ms < now - created)):  # else its rows are newer
            with self._db.autocommit() as conn:
                segments = [(s.ident, s.size_bytes, s.max_broker_timestamp)
                            for s in pg_segments.summaries(conn, self._id, start, active + 1)]
            if not segments or segments[-1][0] != active:  # nothing committed in the open one
                segments.append((active, 0, -1))
            cut = retention_cut(segments, end, now, config)
        if cut is None and not swept:  # rows below the log start may be left: delete them
            cut = RetentionCut(start, 0)
        return cut

    def drop_retained(self, cut: RetentionCut) -> int:
        with self._lock:
            self._check_open()
            self._refresh()
            self._drain()
            segment = self._segment_kept(cut.keep_from)
            keep_from = min(cut.keep_from, segment[0])
            moved = keep_from > self._log_start
            if moved:
                self._move_start(keep_from, segment)
        self._sweep()
        return cut.segments if moved else 0
