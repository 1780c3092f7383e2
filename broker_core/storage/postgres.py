"""The ``postgres://user@host:port/db`` engine: topics, partition logs and key-value areas
in PostgreSQL, through psycopg 3 (synchronous, like the storage Protocols) and a
connection pool.

Each record batch is one row of ``edge_entries`` keyed by (partition, base offset), with
its last offset, broker timestamp and max timestamp, so a fetch reads only the rows from
the offset asked for (and only as many as fit in its byte limit). Rows carry the segment
they belong to (rolled by ``segment.bytes`` / ``segment.ms`` as on files), so retention
drops whole segments by the same rule as the other engines.

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

Topic and partition state is cached in this process; brokers sharing the database see
each other's topic changes within a fraction of a second (``pg_changes``, woken by the
change feed ``pg_listen``). A database
error raises
:class:`DatabaseUnavailable` (an OSError: clients get retriable errors); the partition then
fails the appends queued behind the failed one and reloads its row before its next write
(and before its producer state is rebuilt), so a commit whose outcome was lost neither
duplicates nor skips offsets.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg

from broker_core.codec.batch_header import (
    ATTRIBUTES_AT,
    BATCH_HEADER_SIZE,
    CONTROL_BIT,
    BatchHeader,
    check_append,
    set_base_offset,
)

from . import pg_changes
from .cluster import NotOwner
from .config import LogConfig, log_config_for_topic, retention_drops
from .errors import DatabaseUnavailable, LogClosed, OffsetOutOfRange, TopicExists, UnknownTopic
from .fileless import FilelessPartition, FilelessStorage
from .model import BatchInfo, TopicInfo
from .pg_cluster import PgCluster
from .pg_commits import INSERT_ENTRY, GroupCommitter, Pending, Ticket
from .pg_database import Conn, Database, unavailable
from .pg_listen import PgListener
from .pg_readahead import Buffer, ReadAhead
from .protocols import NOTHING_CHANGED, DiskUsage, Refreshed
from .region import FileRegion
from .segments import SealedSegment, check_cover
from .topic_table import TopicEntry


def _info(row: tuple[object, ...]) -> BatchInfo:
    base, last, max_ts, broker_ts, batch = row
    assert isinstance(batch, bytes)
    return BatchInfo(int(str(base)), int(str(last)), int(str(max_ts)), int(str(broker_ts)),
                     batch)


_CHUNK = 64
"""Rows per query when reading forward."""

_DRAIN_TIMEOUT_S = 30.0
"""Longest a reload of a partition's row waits for its queued appends to be answered."""

_ENTRY_COLUMNS = "base_offset, last_offset, max_ts, broker_ts, batch"
_HEADER_COLUMNS = (
    "base_offset, last_offset, max_ts, broker_ts, CASE WHEN (get_byte(substring(batch FROM 1 "
    f"FOR {BATCH_HEADER_SIZE}), {ATTRIBUTES_AT + 1}) & {CONTROL_BIT}) <> 0 THEN batch ELSE "
    f"substring(batch FROM 1 FOR {BATCH_HEADER_SIZE}) END")
"""The entry columns with only the 61-byte header of a batch that is not a control batch
(attributes bit 5 clear; ``get_byte`` counts from 0, and the bit is in the attributes' low
byte): what replaying producer state reads, without the records."""

_CAS_INSERT = (
    "INSERT INTO edge_kv (key, value) VALUES (%(k)s, %(v)s) ON CONFLICT DO NOTHING",
    "INSERT INTO edge_partition_kv (partition_id, key, value) VALUES (%(s)s, %(k)s, %(v)s)"
    " ON CONFLICT DO NOTHING")
_CAS_UPDATE = (
    "UPDATE edge_kv SET value = %(v)s WHERE key = %(k)s AND value = %(e)s",
    "UPDATE edge_partition_kv SET value = %(v)s WHERE partition_id = %(s)s AND key = %(k)s"
    " AND value = %(e)s")
"""compare_and_set's statements (for no value expected / a value expected), each for the
broker's area and for a partition's."""


class PgKeyValues:
    """A key-value area in a table; ``scope`` is a partition id (``edge_partition_kv``) or
    None for the broker's own (``edge_kv``), whose writes count in ``changes.kv`` so
    that the other brokers sharing the database read them again."""

    def __init__(self, db: Database, scope: int | None, check: Callable[[], None],
                 epoch: Callable[[], int | None] | None = None,
                 before_read: Callable[[], None] | None = None) -> None:
        self._db = db
        self._scope = scope
        self._check = check
        self._epoch = epoch
        self._before_read = before_read or check
        """Run before a read (a partition's: its row reloaded if stale)."""

    def get(self, key: str) -> bytes | None:
        self._before_read()
        with self._db.autocommit() as conn:
            if self._scope is None:
                row = conn.execute("SELECT value FROM edge_kv WHERE key = %s", (key,)).fetchone()
            else:
                row = conn.execute(
                    "SELECT value FROM edge_partition_kv WHERE partition_id = %s AND key = %s",
                    (self._scope, key)).fetchone()
        if row is None:
            return None
        assert isinstance(row[0], bytes)
        return row[0]

    def put(self, key: str, value: bytes, *, durable: bool = True) -> None:
        self._check()  # every commit is durable: ``durable`` changes nothing here
        with self._db.tx() as conn:
            if self._scope is None:
                conn.execute("INSERT INTO edge_kv VALUES (%s, %s) ON CONFLICT (key) "
                             "DO UPDATE SET value = excluded.value", (key, bytes(value)))
                pg_changes.bump(conn, pg_changes.KV)
            else:  # only the partition's owner, at the epoch it holds
                epoch = self._epoch() if self._epoch is not None else None
                stored = conn.execute(
                    "INSERT INTO edge_partition_kv SELECT id, %s, %s FROM edge_partitions"
                    " WHERE id = %s AND owner_epoch = coalesce(%s, owner_epoch)"
                    " ON CONFLICT (partition_id, key)"
                    " DO UPDATE SET value = excluded.value",
                    (key, bytes(value), self._scope, epoch)).rowcount
                if stored != 1:
                    raise NotOwner(f"partition {self._scope} is no longer owned here")

    def compare_and_set(self, key: str, expected: bytes | None, value: bytes) -> bool:
        """One conditional statement: a concurrent writer's commit makes the condition
        fail (PostgreSQL re-checks an UPDATE's condition on the row it waited for, and an
        INSERT that meets a row inserted meanwhile does nothing)."""
        self._check()
        statements = _CAS_INSERT if expected is None else _CAS_UPDATE
        with self._db.tx() as conn:
            if self._scope is not None:  # only the partition's owner, at the epoch it holds
                epoch = self._epoch() if self._epoch is not None else None
                if conn.execute("SELECT 1 FROM edge_partitions WHERE id = %s AND owner_epoch"
                                " = coalesce(%s, owner_epoch) FOR SHARE",
                                (self._scope, epoch)).fetchone() is None:
                    raise NotOwner(f"partition {self._scope} is no longer owned here")
            stored = conn.execute(statements[self._scope is not None], {
                "s": self._scope, "k": key, "v": bytes(value), "e": expected}).rowcount == 1
            if stored and self._scope is None:
                pg_changes.bump(conn, pg_changes.KV)
        return stored


class PgPartition(FilelessPartition):
    """One partition's log in PostgreSQL, its row's state cached; thread-safe."""

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
        the row for a reload."""
        with self._lock:
            before, self._epoch = self._epoch, epoch
            self._spoil()
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
        """A transaction of a write; on failure the cached row is reloaded before the next."""
        try:
            with self._db.tx() as conn:
                yield conn
        except BaseException:
            self._spoil()
            raise

    def _queue(self, batch: bytearray, header: BatchHeader, ticket: Ticket) -> int:
        """Give ``batch`` the next offsets and queue it for the group commit."""
        check_append(batch, header)
        with self._lock:
            self._check_open()
            epoch = self._owned_epoch()
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

    def append(self, batch: bytearray, header: BatchHeader) -> int:
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

    def append_deferred(self, batch: bytearray, header: BatchHeader,
                        ) -> tuple[int, asyncio.Future[None]]:
        """From the event loop: the base offset at once, and a future done once the batch
        is committed (failed with DatabaseUnavailable when it was not)."""
        ticket = Ticket(asyncio.get_running_loop())
        base = self._queue(batch, header, ticket)
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

    def _rows_from(self, conn: Conn, offset: int, limit: int,
                   max_bytes: int | None = None,
                   columns: str = _ENTRY_COLUMNS) -> list[BatchInfo]:
        """Up to ``limit`` batches from the one holding ``offset`` (by the primary key);
        with ``max_bytes``, only the first and those that fit with it (the others' bytes
        never leave the server: a row's batch is read only when it is returned)."""
        rows = conn.execute(
            f"SELECT {columns} FROM (SELECT *, sum(size) OVER (ORDER BY base_offset)"
            "  AS upto, row_number() OVER (ORDER BY base_offset) AS nth FROM edge_entries"
            "  WHERE partition_id = %(p)s AND base_offset >= coalesce((SELECT base_offset"
            "   FROM edge_entries WHERE partition_id = %(p)s AND base_offset <= %(o)s"
            "   ORDER BY base_offset DESC LIMIT 1), %(o)s)"
            "  AND last_offset >= %(o)s ORDER BY base_offset LIMIT %(n)s) AS page"
            " WHERE nth = 1 OR upto <= %(b)s ORDER BY base_offset",
            {"p": self._id, "o": offset, "n": limit,
             "b": max_bytes if max_bytes is not None else 1 << 62}, binary=True).fetchall()
        return [_info(row) for row in rows]

    def read(self, offset: int, max_bytes: int) -> list[memoryview | FileRegion]:
        with self._lock:
            self._check_open()
            self._check_offset(offset)
            end = self._next
        page = self._ahead.take(offset, max_bytes)
        if page is None:
            page = self._page(offset, max_bytes, end)
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
                rows = self._rows_from(conn, offset, _CHUNK, max_bytes - taken)
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
        return self._follow(offset, _HEADER_COLUMNS)

    def _follow(self, offset: int, columns: str = _ENTRY_COLUMNS) -> Iterator[BatchInfo]:
        """Batches from ``offset`` on, following appends made while iterating."""
        while not self._closed and self._log_start <= offset < self._next:
            with self._db.autocommit() as conn:
                rows = self._rows_from(conn, offset, _CHUNK, columns=columns)
            if not rows:
                return
            for info in rows:
                yield info
                offset = info.last_offset + 1

    def _one(self, where: str, order: str, *args: object) -> BatchInfo | None:
        with self._lock:
            self._check_open()
            start = self._log_start
        with self._db.autocommit() as conn:
            row = conn.execute(
                f"SELECT {_ENTRY_COLUMNS} FROM edge_entries WHERE partition_id = %s"
                f" AND last_offset >= %s{where} ORDER BY {order} LIMIT 1",
                (self._id, start, *args), binary=True).fetchone()
        return None if row is None else _info(row)

    def find_first_batch_with_timestamp_at_least(self, timestamp: int) -> BatchInfo | None:
        return self._one(" AND max_ts >= %s", "base_offset", timestamp)

    def batch_with_max_timestamp(self) -> BatchInfo | None:
        return self._one("", "max_ts DESC, base_offset")

    def delete_records_before(self, offset: int) -> int:
        with self._lock:
            self._check_open()
            self._refresh()
            self._drain()
            if offset < 0 or offset > self._next:
                raise OffsetOutOfRange(
                    f"offset {offset} is outside [0, {self._next}] of {self._location}")
            if offset <= self._log_start:
                return self._log_start
            segment = self._segment
            if segment[1] > 0 and self._next <= offset:
                segment = (self._next, 0, self._clock())
            self._cut(offset, "last_offset < %s", offset, segment)
            return self._log_start

    def _cut(self, log_start: int, where: str, bound: int,
             segment: tuple[int, int, int]) -> None:
        """Delete the entries ``where`` says (below ``bound``) and move the log start to
        ``log_start``, in one transaction (lock held)."""
        epoch = self._owned_epoch()
        with self._writing() as conn:
            owned = conn.execute(
                "SELECT 1 FROM edge_partitions WHERE id = %s AND owner_epoch"
                " = coalesce(%s, owner_epoch) FOR UPDATE", (self._id, epoch)).fetchone()
            if owned is None:
                raise NotOwner(f"partition {self._location} was taken over")
            conn.execute(f"DELETE FROM edge_entries WHERE partition_id = %s AND {where}",
                         (self._id, bound))
            row = conn.execute(
                "UPDATE edge_partitions SET log_start = %(s)s, size_bytes = (SELECT"
                " coalesce(sum(size), 0) FROM edge_entries WHERE partition_id = %(p)s),"
                " segment_base = %(b)s, segment_size = %(z)s, segment_created_ms = %(c)s"
                f" WHERE id = %(p)s RETURNING {self._ROW}",
                {"s": log_start, "p": self._id, "b": segment[0], "z": segment[1],
                 "c": segment[2]}).fetchone()
        assert row is not None
        self._load(row)

    def sealed_segments(self) -> list[SealedSegment]:
        """The committed rows of every segment before the one appends go to, by segment."""
        with self._lock:
            self._check_open()
            active, start = self._segment[0], self._log_start
        with self._db.autocommit() as conn:
            rows = conn.execute(
                "SELECT segment_base, min(base_offset), max(last_offset) + 1, sum(size),"
                " min(broker_ts), max(broker_ts), max(max_ts) FROM edge_entries"
                " WHERE partition_id = %s"
                " AND segment_base < %s AND last_offset >= %s GROUP BY segment_base"
                " ORDER BY segment_base", (self._id, active, start)).fetchall()
        return [SealedSegment(*(int(str(value)) for value in row)) for row in rows]

    def replace_segments(self, segments: Sequence[SealedSegment],
                         batches: Sequence[BatchInfo]) -> bool:
        """Delete the segments' rows and insert ``batches`` (as rows of the first segment)
        in one transaction, only while this broker owns the partition at its epoch and the
        rows are still as given."""
        check_cover(segments, batches)
        with self._lock:
            self._check_open()
            epoch = self._owned_epoch()
        first = segments[0]
        where = ("partition_id = %(p)s AND segment_base = ANY(%(s)s) AND base_offset >= %(f)s"
                 " AND base_offset < %(n)s")
        keys = {"p": self._id, "s": [segment.ident for segment in segments],
                "f": first.first_offset, "n": segments[-1].next_offset}
        with self._db.tx() as conn:
            owned = conn.execute(
                "SELECT log_start FROM edge_partitions WHERE id = %s AND owner_epoch"
                " = coalesce(%s, owner_epoch) FOR UPDATE", (self._id, epoch)).fetchone()
            if owned is None:
                return False
            found = conn.execute(
                f"SELECT segment_base, min(base_offset), max(last_offset) + 1, sum(size)"
                f" FROM edge_entries WHERE {where} GROUP BY segment_base"
                f" ORDER BY segment_base", keys).fetchall()
            as_given = [(s.ident, s.first_offset, s.next_offset, s.size_bytes)
                        for s in segments]
            if [tuple(int(str(v)) for v in row) for row in found] != as_given:
                return False
            log_start = int(str(owned[0]))
            rows = [(self._id, info.base_offset, info.last_offset, first.ident,
                     info.broker_timestamp, info.max_timestamp, len(info.batch),
                     bytes(info.batch)) for info in batches if info.last_offset >= log_start]
            conn.execute(f"DELETE FROM edge_entries WHERE {where}", keys)
            if rows:
                with conn.cursor() as cursor:
                    cursor.executemany(INSERT_ENTRY, rows)
            reclaimed = sum(s.size_bytes for s in segments) - sum(row[6] for row in rows)
            conn.execute("UPDATE edge_partitions SET size_bytes = size_bytes - %s WHERE id = %s",
                         (reclaimed, self._id))
        with self._lock:
            self._size -= reclaimed
        self._ahead.drop()
        return True

    def enforce_retention(self) -> int:
        with self._lock:
            self._check_open()
            if self._epoch is None and self._fenced():
                return 0  # its owner enforces it
            self._refresh()
            self._drain()
            with self._db.autocommit() as conn:
                sealed = [(int(str(base)), int(str(size)), int(str(newest))) for
                          base, size, newest in conn.execute(
                    "SELECT segment_base, sum(size), max(broker_ts) FROM edge_entries"
                    " WHERE partition_id = %s AND segment_base < %s"
                    " GROUP BY segment_base ORDER BY segment_base",
                    (self._id, self._segment[0])).fetchall()]
            count = retention_drops([(size, newest) for _, size, newest in sealed],
                                    self._segment[1], self._clock(), self._config)
            if count:
                cut = sealed[count][0] if count < len(sealed) else self._segment[0]
                self._cut(max(self._log_start, cut), "segment_base < %s", cut, self._segment)
            return count


def public_url(url: str) -> str:
    """``url`` without its password and its query (for log lines and DescribeLogDirs).
    The hosts stay as written: libpq's multi-host form ``host1:port1,host2:port2`` too."""
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    netloc = (f"{parts.username}@" if parts.username else "") + hosts
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class PgStorage(FilelessStorage[PgPartition]):
    """Every topic in one PostgreSQL database, which other brokers may share; thread-safe.

    The topics are cached here. :meth:`refresh` takes in what other brokers changed (see
    ``pg_changes``); a topic or partition the cache lacks is looked up in the database
    before it is called unknown, so a topic created through another broker a moment ago
    is found at once. ``_versions`` remembers the counter value of this broker's own
    latest change of each topic, so that a snapshot read before it cannot undo it.
    """

    def __init__(self, url: str, default_config: LogConfig, clock: Callable[[], int]) -> None:
        super().__init__()
        self._url = public_url(url)
        self._default_config = default_config
        self._clock = clock
        self._db = Database(url, self._url)
        self._created = self._db.found_version == 0
        self._drop_at_close = False
        self._workers = (GroupCommitter(self._db), ReadAhead())
        self._kv = PgKeyValues(self._db, None, self._check_open)
        self._cluster = PgCluster(self._db, self.partition)
        self._listener = PgListener(self._db.conninfo, self._url)
        self._versions: dict[str, int] = {}
        self._gone: dict[str, list[PgPartition]] = {}  # dropped since the last refresh
        self._seen = self._load()

    @property
    def cluster(self) -> PgCluster:
        return self._cluster

    @property
    def feed(self) -> PgListener:
        """Notifications of other brokers' changes (a connection from the first
        subscription on: ``pg_listen``)."""
        return self._listener

    def _snapshot(self, only: str | None = None) -> pg_changes.Snapshot:
        with self._db.tx() as conn:
            return pg_changes.read_snapshot(conn, PgPartition._ROW, only)

    def _load(self) -> tuple[int, int]:
        """Read every topic; the change counters read with them."""
        snapshot = self._snapshot()
        with self._lock:
            self._apply(snapshot, set(snapshot.topics) | set(self._topics))
            for name, version in list(self._versions.items()):
                if version <= snapshot.version:
                    del self._versions[name]
        return snapshot.version, snapshot.kv_version

    def _apply(self, snapshot: pg_changes.Snapshot, names: Iterable[str]) -> None:
        """Make the cache of topics ``names`` what ``snapshot`` says, except where this
        broker changed a topic after the snapshot (lock held)."""
        for name in names:
            if self._versions.get(name, 0) > snapshot.version:
                continue
            rows = snapshot.topics.get(name)
            topic = self._topics.get(name)
            if topic is not None and (rows is None or rows.info.topic_id != topic.info.topic_id):
                del self._topics[name]
                for partition in topic.partitions:
                    partition.close()
                self._gone.setdefault(name, []).extend(topic.partitions)
                topic = None
            if rows is None:
                continue
            if topic is None:
                config = log_config_for_topic(self._default_config, rows.info.configs)
                topic = self._topics[name] = TopicEntry(rows.info, config, [])
            elif topic.info.configs != rows.info.configs:
                topic.info.configs = rows.info.configs
                topic.config = log_config_for_topic(self._default_config, rows.info.configs)
                for partition in topic.partitions:
                    partition.update_config(topic.config)
            for index in range(len(topic.partitions), len(rows.partitions)):
                pid, state = rows.partitions[index]
                topic.partitions.append(PgPartition(
                    self._db, self._workers, pid, self._where(name, index), topic.config,
                    self._clock, state, self._cluster.joined))
            topic.info.num_partitions = len(topic.partitions)

    def refresh(self) -> Refreshed:
        """One read of the change counters; the topics again when they moved."""
        if self._closed:
            return NOTHING_CHANGED
        with self._db.autocommit() as conn:
            version, kv_version = pg_changes.counters(conn)
        seen_version, seen_kv = self._seen
        if version != seen_version:
            version, kv_version = self._load()
        self._seen = version, kv_version
        with self._lock:
            gone, self._gone = self._gone, {}
        if not gone and kv_version == seen_kv:
            return NOTHING_CHANGED
        return Refreshed(gone, kv_version != seen_kv)

    def topic_sizes(self) -> dict[str, int]:
        """One aggregate over every partition row: what all brokers stored, as committed."""
        with self._db.autocommit() as conn:
            rows = conn.execute("SELECT topic, sum(size_bytes) FROM edge_partitions"
                                " GROUP BY topic").fetchall()
        return {str(topic): int(str(size)) for topic, size in rows}

    def _look_up(self, name: str) -> None:
        """Take in the database's rows of topic ``name`` (a cache miss); a database that
        cannot answer leaves the cache as it is (the caller finds the topic unknown, a
        retriable answer, and the refresh loop reports the database)."""
        if self._closed:
            return
        try:
            snapshot = self._snapshot(name)
        except (DatabaseUnavailable, LogClosed):
            return
        with self._lock:
            self._apply(snapshot, (name,))

    def topic(self, name: str) -> TopicInfo | None:
        found = super().topic(name)
        if found is None:
            self._look_up(name)
            found = super().topic(name)
        return found

    def partition(self, name: str, partition: int) -> PgPartition | None:
        found = super().partition(name, partition)
        if found is None:
            self._look_up(name)
            found = super().partition(name, partition)
        return found

    def add_partitions(self, name: str, new_total: int) -> TopicInfo:
        self._look_up(name)  # grow from the count another broker may have set meanwhile
        return super().add_partitions(name, new_total)

    def _where(self, name: str, partition: int) -> str:
        return f"{self._url}#{name}/{partition}"

    @property
    def default_config(self) -> LogConfig:
        return self._default_config

    @property
    def location(self) -> str:
        return self._url

    def names_location(self, path: str) -> bool:
        return path == self._url

    @property
    def kv(self) -> PgKeyValues:
        return self._kv

    def disk_usage(self) -> DiskUsage:
        return DiskUsage(-1, -1)  # the database's volume is not ours to see: "unknown"

    def _changed(self, conn: Conn, name: str) -> None:
        """Count a change of topic ``name`` in its transaction (lock held)."""
        self._versions[name] = pg_changes.bump(conn, pg_changes.TOPICS)

    def _insert_partitions(self, conn: Conn, name: str, first: int, last: int,
                           config: LogConfig) -> list[PgPartition]:
        now = self._clock()
        stores = []
        for p in range(first, last):
            row = conn.execute(
                "INSERT INTO edge_partitions (topic, partition, segment_created_ms)"
                f" VALUES (%s, %s, %s) RETURNING id, {PgPartition._ROW}",
                (name, p, now)).fetchone()
            assert row is not None
            stores.append(PgPartition(self._db, self._workers, int(str(row[0])),
                                      self._where(name, p), config, self._clock, row[1:],
                                      self._cluster.joined))
        return stores

    def _store_topic(self, info: TopicInfo, config: LogConfig) -> list[PgPartition]:
        with self._db.tx() as conn:
            if conn.execute("INSERT INTO edge_topics VALUES (%s, %s, %s, %s) ON CONFLICT"
                            " DO NOTHING", (info.name, info.topic_id, info.num_partitions,
                                            json.dumps(info.configs))).rowcount != 1:
                raise TopicExists(info.name)  # created through another broker meanwhile
            self._changed(conn, info.name)
            return self._insert_partitions(conn, info.name, 0, info.num_partitions, config)

    def _store_deletion(self, name: str) -> bool:
        with self._db.tx() as conn:
            if conn.execute("DELETE FROM edge_topics WHERE name = %s", (name,)).rowcount != 1:
                return False  # deleted through another broker meanwhile
            self._changed(conn, name)
            return True

    def _store_growth(self, name: str, current: int, new_total: int,
                      config: LogConfig) -> list[PgPartition]:
        with self._db.tx() as conn:
            row = conn.execute("SELECT num_partitions FROM edge_topics WHERE name = %s"
                               " FOR UPDATE", (name,)).fetchone()
            if row is None:
                raise UnknownTopic(name)
            if int(str(row[0])) != current:  # grown through another broker meanwhile
                raise ValueError(f"topic {name!r} has {row[0]} partitions now; cannot change "
                                 f"to {new_total} from {current}")
            added = self._insert_partitions(conn, name, current, new_total, config)
            conn.execute("UPDATE edge_topics SET num_partitions = %s WHERE name = %s",
                         (new_total, name))
            self._changed(conn, name)
        return added

    def _store_configs(self, name: str, configs: dict[str, str],
                       expected: Mapping[str, str] | None) -> bool:
        statement = "UPDATE edge_topics SET configs = %s WHERE name = %s"
        args = [json.dumps(configs), name]
        if expected is not None:
            statement += " AND configs = %s::jsonb"
            args.append(json.dumps(dict(expected)))
        with self._db.tx() as conn:
            stored = conn.execute(statement, args).rowcount == 1
            if stored:
                self._changed(conn, name)
        if not stored:  # changed or deleted through another broker meanwhile
            self._look_up(name)
        return stored

    def _release(self) -> list[str]:
        self._listener.close()
        for worker in self._workers:
            worker.close()
        try:
            # the schema this failed start created goes, unless another broker uses it now
            drop = self._drop_at_close and not self._cluster.others_present()
            self._db.close(drop=drop)
        except psycopg.Error as exc:
            return [f"closing {self._url}: {unavailable(exc).strerror}"]
        return []

    def discard_created(self, *, at_close: bool = False) -> None:
        if not self._created:
            return  # the schema was there before: leave what others may rely on
        self._drop_at_close = True
        if not at_close:
            self.close()


def open_postgres_storage(url: str, default_config: LogConfig,
                          clock: Callable[[], int]) -> PgStorage:
    """The storage in the PostgreSQL database ``url`` names, its schema migrated."""
    parts = urlsplit(url)
    if not parts.hostname or parts.path in ("", "/"):
        raise ValueError(f"PostgreSQL storage URL needs a host and a database: "
                         f"{public_url(url)!r}")
    return PgStorage(url, default_config, clock)
