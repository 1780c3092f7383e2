"""The ``postgres://user@host:port/db`` engine: topics, partition logs and key-value areas
in PostgreSQL, through psycopg 3 (synchronous, like the storage Protocols) and a
connection pool.

Each record batch is one row of ``edge_entries`` keyed by (partition, base offset), with
its last offset, broker timestamp and max timestamp, so a fetch reads only the rows from
the offset asked for. An append inserts the row and moves the partition row's
``next_offset`` in one transaction, conditioned on the offset it expected: offsets stay
continuous, and an append is acknowledged only once PostgreSQL committed it. Rows carry
the segment they belong to (rolled by ``segment.bytes`` / ``segment.ms`` as on files), so
retention drops whole segments by the same rule as the other engines.

Topic and partition state is cached in this process (one broker owns the database for
now). A database error raises :class:`DatabaseUnavailable` (an OSError: clients get
retriable errors); the partition then reloads its row before its next write, so a commit
whose outcome was lost neither duplicates nor skips offsets.
"""

from __future__ import annotations

import errno
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg
import psycopg_pool

from .batch_header import check_append, set_base_offset
from .config import LogConfig, log_config_for_topic, retention_drops
from .errors import DatabaseUnavailable, LogClosed, OffsetOutOfRange
from .fileless import FilelessPartition, FilelessStorage
from .model import BatchInfo, TopicInfo
from .pg_schema import drop_schema, migrate
from .protocols import DiskUsage
from .region import FileRegion
from .topic_table import TopicEntry

Conn = psycopg.Connection[tuple[object, ...]]

_CHUNK = 64
"""Rows per query when reading forward."""

_CONNECT_TIMEOUT_S = 5
_CHECKOUT_TIMEOUT_S = 1.0
"""How long a statement waits for a pooled connection: while the database is away, a
write fails after this (a retriable error) instead of holding its caller."""
_STATEMENT_TIMEOUT_MS = 5000
"""Longest a statement, or an unanswered send to the database host, may take."""

logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
"""The pool's own warnings repeat on every reconnection attempt; the write-fault log says
it once per cause (``storage_faults``)."""


def _unavailable(exc: Exception) -> DatabaseUnavailable:
    """The OSError for a database failure: connection trouble and other refusals are two
    causes (each logged once by the write-fault log)."""
    lost = isinstance(exc, psycopg.OperationalError | psycopg_pool.PoolTimeout)
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    code = errno.ECONNREFUSED if lost else errno.EIO
    return DatabaseUnavailable(code, f"PostgreSQL {'unreachable' if lost else 'error'}: {first}")


class Database:
    """The connection pool and the one way statements run: a transaction that commits on
    success, with database errors turned into :class:`DatabaseUnavailable`."""

    def __init__(self, conninfo: str, where: str) -> None:
        self.where = where
        try:
            with psycopg.connect(conninfo, connect_timeout=_CONNECT_TIMEOUT_S) as conn:
                self.found_version = migrate(conn, where)
        except psycopg.Error as exc:
            raise _unavailable(exc) from None
        self._pool = psycopg_pool.ConnectionPool(
            conninfo, min_size=1, max_size=4, timeout=_CHECKOUT_TIMEOUT_S, open=True,
            kwargs={"connect_timeout": _CONNECT_TIMEOUT_S, "autocommit": True,
                    # a database host that stops answering must not hold the event loop
                    # until TCP gives up: statements and silent peers time out
                    "options": f"-c statement_timeout={_STATEMENT_TIMEOUT_MS}",
                    "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2,
                    "keepalives_count": 2, "tcp_user_timeout": _STATEMENT_TIMEOUT_MS},
            name="edge-storage")

    @contextmanager
    def tx(self) -> Iterator[Conn]:
        """A connection inside one transaction, committed when the block ends."""
        try:
            with self._pool.connection() as conn, conn.transaction():
                yield conn
        except psycopg_pool.PoolClosed:
            raise LogClosed("the storage is closed") from None
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise _unavailable(exc) from None

    def statement(self, sql: str, params: Mapping[str, object]) -> int:
        """Run one statement as its own transaction (one round trip: the pool's
        connections autocommit); the rows it changed."""
        try:
            with self._pool.connection() as conn:
                return conn.execute(sql.encode(), params).rowcount
        except psycopg_pool.PoolClosed:
            raise LogClosed("the storage is closed") from None
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise _unavailable(exc) from None

    def close(self, *, drop: bool = False) -> None:
        if drop:
            with self._pool.connection() as conn:
                drop_schema(conn)
        self._pool.close()


def _info(row: tuple[object, ...]) -> BatchInfo:
    base, last, max_ts, broker_ts, batch = row
    assert isinstance(batch, bytes)
    return BatchInfo(int(str(base)), int(str(last)), int(str(max_ts)), int(str(broker_ts)),
                     batch)


_ENTRY_COLUMNS = "base_offset, last_offset, max_ts, broker_ts, batch"

_APPEND = (
    "WITH moved AS (UPDATE edge_partitions SET next_offset = %(last)s + 1,"
    " size_bytes = size_bytes + %(size)s, segment_base = %(seg)s,"
    " segment_size = %(seg_size)s, segment_created_ms = %(created)s"
    " WHERE id = %(p)s AND next_offset = %(base)s RETURNING id)"
    " INSERT INTO edge_entries SELECT id, %(base)s, %(last)s, %(seg)s, %(now)s, %(max)s,"
    " %(size)s, %(batch)s FROM moved")
"""An append: the entry row and the partition row's move, one atomic statement."""


class PgKeyValues:
    """A key-value area in a table; ``scope`` is a partition id (``edge_partition_kv``) or
    None for the broker's own (``edge_kv``)."""

    def __init__(self, db: Database, scope: int | None,
                 check: Callable[[], None]) -> None:
        self._db = db
        self._scope = scope
        self._check = check

    def get(self, key: str) -> bytes | None:
        self._check()
        with self._db.tx() as conn:
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
            else:
                conn.execute("INSERT INTO edge_partition_kv VALUES (%s, %s, %s) ON CONFLICT "
                             "(partition_id, key) DO UPDATE SET value = excluded.value",
                             (self._scope, key, bytes(value)))


class PgPartition(FilelessPartition):
    """One partition's log in PostgreSQL, its row's state cached; thread-safe."""

    def __init__(self, db: Database, pid: int, location: str, config: LogConfig,
                 clock: Callable[[], int], row: tuple[object, ...] | None = None) -> None:
        self._db = db
        self._id = pid
        self._location = location
        self._config = config
        self._clock = clock
        self._lock = threading.RLock()
        self._closed = False
        self._stale = row is None
        self._log_start = self._next = self._size = 0
        self._segment = (0, 0, clock())  # base offset, size, created ms
        if row is not None:
            self._load(row)
        self._opened_next = self._next
        self._state = PgKeyValues(db, pid, self._check_open)

    _ROW = "log_start, next_offset, size_bytes, segment_base, segment_size, segment_created_ms"

    def _load(self, row: tuple[object, ...]) -> None:
        values = [int(str(v)) for v in row]
        self._log_start, self._next, self._size = values[0], values[1], values[2]
        self._segment = (values[3], values[4], values[5])
        self._stale = False

    def _refresh(self) -> None:
        """Reload the partition row after a failed statement (lock held)."""
        if self._stale:
            with self._db.tx() as conn:
                row = conn.execute(f"SELECT {self._ROW} FROM edge_partitions WHERE id = %s",
                                   (self._id,)).fetchone()
            if row is None:
                self._closed = True
                raise LogClosed(f"partition {self._location} is gone")
            self._load(row)

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

    @contextmanager
    def _writing(self) -> Iterator[Conn]:
        """A transaction of a write; on failure the cached row is reloaded before the next."""
        try:
            with self._db.tx() as conn:
                yield conn
        except BaseException:
            self._stale = True
            raise

    def append(self, batch: bytearray, last_offset_delta: int, max_timestamp: int) -> int:
        check_append(batch, last_offset_delta)
        with self._lock:
            self._check_open()
            self._refresh()
            now = self._clock()
            seg_base, seg_size, seg_created = self._segment
            if seg_size > 0 and (seg_size + len(batch) > self._config.segment_bytes
                                 or now - seg_created >= self._config.segment_ms):
                seg_base, seg_size, seg_created = self._next, 0, now
            base = self._next
            set_base_offset(batch, base)
            last = base + last_offset_delta
            try:  # one statement: the partition row moves only from the offset expected
                added = self._db.statement(_APPEND, {
                    "p": self._id, "base": base, "last": last, "seg": seg_base,
                    "now": now, "max": max_timestamp, "size": len(batch),
                    "batch": bytes(batch), "seg_size": seg_size + len(batch),
                    "created": seg_created})
            except BaseException:
                self._stale = True
                raise
            if added != 1:
                self._stale = True
                raise DatabaseUnavailable(
                    errno.ESTALE, f"partition {self._location} moved under this broker")
            self._next = last + 1
            self._size += len(batch)
            self._segment = (seg_base, seg_size + len(batch), seg_created)
            return base

    def _rows_from(self, conn: Conn, offset: int, limit: int) -> list[BatchInfo]:
        """Up to ``limit`` batches from the one holding ``offset`` (by the primary key)."""
        rows = conn.execute(
            f"SELECT {_ENTRY_COLUMNS} FROM edge_entries WHERE partition_id = %(p)s"
            " AND base_offset >= coalesce((SELECT base_offset FROM edge_entries"
            "  WHERE partition_id = %(p)s AND base_offset <= %(o)s"
            "  ORDER BY base_offset DESC LIMIT 1), %(o)s)"
            " AND last_offset >= %(o)s ORDER BY base_offset LIMIT %(n)s",
            {"p": self._id, "o": offset, "n": limit}).fetchall()
        return [_info(row) for row in rows]

    def read(self, offset: int, max_bytes: int) -> list[memoryview | FileRegion]:
        with self._lock:
            self._check_open()
            self._check_offset(offset)
            end = self._next
        out: list[memoryview | FileRegion] = []
        taken = 0
        with self._db.tx() as conn:
            while offset < end:
                rows = self._rows_from(conn, offset, _CHUNK)
                for info in rows:
                    if out and taken + len(info.batch) > max_bytes:
                        return out
                    out.append(memoryview(info.batch))
                    taken += len(info.batch)
                    offset = info.last_offset + 1
                if len(rows) < _CHUNK:
                    break
        return out

    def _follow(self, offset: int) -> Iterator[BatchInfo]:
        """Batches from ``offset`` on, following appends made while iterating."""
        while not self._closed and self._log_start <= offset < self._next:
            with self._db.tx() as conn:
                rows = self._rows_from(conn, offset, _CHUNK)
            if not rows:
                return
            for info in rows:
                yield info
                offset = info.last_offset + 1

    def _one(self, where: str, order: str, *args: object) -> BatchInfo | None:
        with self._lock:
            self._check_open()
            start = self._log_start
        with self._db.tx() as conn:
            row = conn.execute(
                f"SELECT {_ENTRY_COLUMNS} FROM edge_entries WHERE partition_id = %s"
                f" AND last_offset >= %s{where} ORDER BY {order} LIMIT 1",
                (self._id, start, *args)).fetchone()
        return None if row is None else _info(row)

    def find_first_batch_with_timestamp_at_least(self, timestamp: int) -> BatchInfo | None:
        return self._one(" AND max_ts >= %s", "base_offset", timestamp)

    def batch_with_max_timestamp(self) -> BatchInfo | None:
        return self._one("", "max_ts DESC, base_offset")

    def delete_records_before(self, offset: int) -> int:
        with self._lock:
            self._check_open()
            self._refresh()
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
        with self._writing() as conn:
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

    def enforce_retention(self) -> int:
        with self._lock:
            self._check_open()
            self._refresh()
            with self._db.tx() as conn:
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
    """Every topic in one PostgreSQL database; thread-safe."""

    def __init__(self, url: str, default_config: LogConfig, clock: Callable[[], int]) -> None:
        super().__init__()
        self._url = public_url(url)
        self._default_config = default_config
        self._clock = clock
        self._db = Database(url, self._url)
        self._created = self._db.found_version == 0
        self._drop_at_close = False
        self._kv = PgKeyValues(self._db, None, self._check_open)
        self._load()

    def _load(self) -> None:
        with self._db.tx() as conn:
            topics = conn.execute(
                "SELECT name, topic_id, num_partitions, configs FROM edge_topics").fetchall()
            parts = conn.execute(
                f"SELECT topic, partition, id, {PgPartition._ROW} FROM edge_partitions"
                " ORDER BY topic, partition").fetchall()
        by_topic: dict[str, list[tuple[object, ...]]] = {}
        for row in parts:
            by_topic.setdefault(str(row[0]), []).append(row)
        for name, topic_id, count, configs in topics:
            own = {str(k): str(v) for k, v in dict(configs).items()}  # type: ignore[call-overload]
            config = log_config_for_topic(self._default_config, own)
            info = TopicInfo(str(name), uuid.UUID(str(topic_id)), int(str(count)), own)
            stores = [PgPartition(self._db, int(str(row[2])), self._where(info.name, i),
                                  config, self._clock, row[3:])
                      for i, row in enumerate(by_topic.get(info.name, []))]
            self._topics[info.name] = TopicEntry(info, config, stores)

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
            stores.append(PgPartition(self._db, int(str(row[0])), self._where(name, p),
                                      config, self._clock, row[1:]))
        return stores

    def _store_topic(self, info: TopicInfo, config: LogConfig) -> list[PgPartition]:
        with self._db.tx() as conn:
            conn.execute("INSERT INTO edge_topics VALUES (%s, %s, %s, %s)",
                         (info.name, info.topic_id, info.num_partitions,
                          json.dumps(info.configs)))
            return self._insert_partitions(conn, info.name, 0, info.num_partitions, config)

    def _store_deletion(self, name: str) -> None:
        with self._db.tx() as conn:
            conn.execute("DELETE FROM edge_topics WHERE name = %s", (name,))

    def _store_growth(self, name: str, current: int, new_total: int,
                      config: LogConfig) -> list[PgPartition]:
        with self._db.tx() as conn:
            added = self._insert_partitions(conn, name, current, new_total, config)
            conn.execute("UPDATE edge_topics SET num_partitions = %s WHERE name = %s",
                         (new_total, name))
        return added

    def _store_configs(self, name: str, configs: dict[str, str]) -> None:
        with self._db.tx() as conn:
            conn.execute("UPDATE edge_topics SET configs = %s WHERE name = %s",
                         (json.dumps(configs), name))

    def _release(self) -> list[str]:
        try:
            self._db.close(drop=self._drop_at_close)
        except psycopg.Error as exc:
            return [f"closing {self._url}: {_unavailable(exc).strerror}"]
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
