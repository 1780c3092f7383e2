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

Topic and partition state is cached in this process; brokers sharing the database see
each other's topic changes within a fraction of a second (``pg_changes``). A database
error raises :class:`DatabaseUnavailable` (an OSError: clients get retriable errors);
the partition then reloads its row before its next write, so a commit whose outcome was
lost neither duplicates nor skips offsets.
"""

from __future__ import annotations

import errno
import json
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from urllib.parse import urlsplit, urlunsplit

import psycopg

from . import pg_changes
from .batch_header import check_append, set_base_offset
from .cluster import NotOwner
from .config import LogConfig, log_config_for_topic, retention_drops
from .errors import DatabaseUnavailable, LogClosed, OffsetOutOfRange, TopicExists
from .fileless import FilelessPartition, FilelessStorage
from .model import BatchInfo, TopicInfo
from .pg_cluster import PgCluster
from .pg_database import Conn, Database, unavailable
from .protocols import NOTHING_CHANGED, DiskUsage, Refreshed
from .region import FileRegion
from .topic_table import TopicEntry


def _info(row: tuple[object, ...]) -> BatchInfo:
    base, last, max_ts, broker_ts, batch = row
    assert isinstance(batch, bytes)
    return BatchInfo(int(str(base)), int(str(last)), int(str(max_ts)), int(str(broker_ts)),
                     batch)


_CHUNK = 64
"""Rows per query when reading forward."""

_ENTRY_COLUMNS = "base_offset, last_offset, max_ts, broker_ts, batch"

_APPEND = (
    "WITH moved AS (UPDATE edge_partitions SET next_offset = %(last)s + 1,"
    " size_bytes = size_bytes + %(size)s, segment_base = %(seg)s,"
    " segment_size = %(seg_size)s, segment_created_ms = %(created)s"
    " WHERE id = %(p)s AND next_offset = %(base)s"
    " AND owner_epoch = coalesce(%(epoch)s, owner_epoch) RETURNING id)"
    " INSERT INTO edge_entries SELECT id, %(base)s, %(last)s, %(seg)s, %(now)s, %(max)s,"
    " %(size)s, %(batch)s FROM moved")
"""An append: the entry row and the partition row's move, one atomic statement, made only
at the offset expected and by the owner at the epoch it holds."""


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
                 epoch: Callable[[], int | None] | None = None) -> None:
        self._db = db
        self._scope = scope
        self._check = check
        self._epoch = epoch

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
            stored = conn.execute(statements[self._scope is not None], {
                "s": self._scope, "k": key, "v": bytes(value), "e": expected}).rowcount == 1
            if stored and self._scope is None:
                pg_changes.bump(conn, pg_changes.KV)
        return stored


class PgPartition(FilelessPartition):
    """One partition's log in PostgreSQL, its row's state cached; thread-safe."""

    def __init__(self, db: Database, pid: int, location: str, config: LogConfig,
                 clock: Callable[[], int], row: tuple[object, ...] | None = None,
                 fenced: Callable[[], bool] = lambda: True) -> None:
        self._db = db
        self._fenced = fenced
        self._id = pid
        self._location = location
        self._config = config
        self._clock = clock
        self._lock = threading.RLock()
        self._closed = False
        self._stale = row is None
        self._log_start = self._next = self._size = self._owner_epoch = 0
        self._segment = (0, 0, clock())  # base offset, size, created ms
        if row is not None:
            self._load(row)
        self._opened_next = self._next
        self._epoch: int | None = None
        """The ownership epoch this broker writes at; None: not owned here."""
        self._state = PgKeyValues(db, pid, self._check_open, self._owned_epoch)

    _ROW = ("log_start, next_offset, size_bytes, segment_base, segment_size,"
            " segment_created_ms, owner_epoch")

    def _load(self, row: tuple[object, ...]) -> None:
        values = [int(str(v)) for v in row]
        self._log_start, self._next, self._size = values[0], values[1], values[2]
        self._segment = (values[3], values[4], values[5])
        self._owner_epoch = values[6]
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
            if self._epoch is not None and self._owner_epoch != self._epoch:
                self._epoch = None  # taken over while this broker was away
                raise NotOwner(f"partition {self._location} was taken over")

    @property
    def partition_id(self) -> int:
        """The partition row's key."""
        return self._id

    def fence(self, epoch: int | None) -> int | None:
        """Write at ``epoch`` from now on (None: write nothing more); return the epoch held
        before. A new epoch reloads the row at once, so that the broker taking a partition
        over serves (and replays) it up to where its last owner left it, not up to what it
        cached when it last looked; otherwise the row is reloaded before the next write."""
        with self._lock:
            before, self._epoch = self._epoch, epoch
            self._stale = True
            if epoch is not None:
                with suppress(NotOwner):  # taken again meanwhile: not served here
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
            epoch = self._owned_epoch()
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
                    "created": seg_created, "epoch": epoch})
            except BaseException:
                self._stale = True
                raise
            if added != 1:
                self._stale = True
                self._refresh()  # NotOwner when another broker took the partition
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

    def enforce_retention(self) -> int:
        with self._lock:
            self._check_open()
            if self._epoch is None and self._fenced():
                return 0  # its owner enforces it
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
    """``url`` without its password (for log lines and DescribeLogDirs)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = (f"{parts.username}@" if parts.username else "") + host \
        + (f":{parts.port}" if parts.port else "")
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
        self._kv = PgKeyValues(self._db, None, self._check_open)
        self._versions: dict[str, int] = {}
        self._gone: dict[str, list[PgPartition]] = {}  # dropped since the last refresh
        self._cluster = PgCluster(self._db, self.partition)
        self._seen = self._load()

    @property
    def cluster(self) -> PgCluster:
        return self._cluster

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
                    self._db, pid, self._where(name, index), topic.config, self._clock, state,
                    self._cluster.joined))
            topic.info.num_partitions = len(topic.partitions)

    def refresh(self) -> Refreshed:
        """One read of the change counters; the topics again when they moved."""
        if self._closed:
            return NOTHING_CHANGED
        with self._db.tx() as conn:
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
            stores.append(PgPartition(self._db, int(str(row[0])), self._where(name, p),
                                      config, self._clock, row[1:], self._cluster.joined))
        return stores

    def _store_topic(self, info: TopicInfo, config: LogConfig) -> list[PgPartition]:
        with self._db.tx() as conn:
            if conn.execute("INSERT INTO edge_topics VALUES (%s, %s, %s, %s) ON CONFLICT"
                            " DO NOTHING", (info.name, info.topic_id, info.num_partitions,
                                            json.dumps(info.configs))).rowcount != 1:
                raise TopicExists(info.name)  # created through another broker meanwhile
            self._changed(conn, info.name)
            return self._insert_partitions(conn, info.name, 0, info.num_partitions, config)

    def _store_deletion(self, name: str) -> None:
        with self._db.tx() as conn:
            conn.execute("DELETE FROM edge_topics WHERE name = %s", (name,))
            self._changed(conn, name)

    def _store_growth(self, name: str, current: int, new_total: int,
                      config: LogConfig) -> list[PgPartition]:
        with self._db.tx() as conn:
            added = self._insert_partitions(conn, name, current, new_total, config)
            conn.execute("UPDATE edge_topics SET num_partitions = %s WHERE name = %s",
                         (new_total, name))
            self._changed(conn, name)
        return added

    def _store_configs(self, name: str, configs: dict[str, str]) -> None:
        with self._db.tx() as conn:
            conn.execute("UPDATE edge_topics SET configs = %s WHERE name = %s",
                         (json.dumps(configs), name))
            self._changed(conn, name)

    def _release(self) -> list[str]:
        try:
            self._db.close(drop=self._drop_at_close)
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
