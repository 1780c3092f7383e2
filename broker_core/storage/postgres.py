"""The ``postgres://user@host:port/db`` engine: topics, partition logs and key-value areas
in PostgreSQL, through psycopg 3 (synchronous, like the storage Protocols) and a
connection pool.

:class:`PgStorage` keeps the topics; a partition's log is a :class:`PgPartition`
(``pg_partition``: its rows, the group-committed appends, retention and the cleaner's
segment swap), a key-value area a :class:`PgKeyValues` (``pg_kv``), and the cluster's
registry :class:`PgCluster` (``pg_cluster``).

Topic and partition state is cached in this process; brokers sharing the database see
each other's topic changes within a fraction of a second (``pg_changes``, woken by the
change feed ``pg_listen``). A database error raises :class:`DatabaseUnavailable` (an
OSError: clients get retriable errors).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from urllib.parse import urlsplit, urlunsplit

import psycopg

from . import pg_changes
from .config import LogConfig, log_config_for_topic
from .errors import CapExceeded, DatabaseUnavailable, LogClosed, TopicExists, UnknownTopic
from .fileless import FilelessStorage
from .model import TenantCap, TopicInfo
from .pg_cluster import PgCluster
from .pg_commits import GroupCommitter
from .pg_database import Conn, Database, unavailable
from .pg_kv import PgKeyValues
from .pg_listen import PgListener
from .pg_partition import PgPartition
from .pg_readahead import ReadAhead
from .protocols import NOTHING_CHANGED, DiskUsage, Refreshed
from .topic_table import TopicEntry


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

    def add_partitions(self, name: str, new_total: int,
                       cap: TenantCap | None = None) -> TopicInfo:
        self._look_up(name)  # grow from the count another broker may have set meanwhile
        return super().add_partitions(name, new_total, cap)

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

    def _store_topic(self, info: TopicInfo, config: LogConfig,
                     cap: TenantCap | None) -> list[PgPartition]:
        with self._db.tx() as conn:
            if cap is not None:
                _check_cap(conn, cap, 1, info.num_partitions)
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
                      config: LogConfig, cap: TenantCap | None) -> list[PgPartition]:
        with self._db.tx() as conn:
            if cap is not None:
                _check_cap(conn, cap, 0, new_total - current)
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


def _check_cap(conn: Conn, cap: TenantCap, topics_more: int, partitions: int) -> None:
    """CapExceeded unless the tenant's topics, counted in the database under a lock of the
    tenant's (held to the end of the transaction, so brokers creating at once take turns),
    leave room for ``topics_more`` more topics and ``partitions`` more partitions."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", ("edge-tenant-cap " + cap.prefix,))
    row = conn.execute(
        "SELECT count(*), coalesce(sum(num_partitions), 0) FROM edge_topics"
        " WHERE left(name, %s) = %s AND left(name, %s) <> %s",
        (len(cap.prefix), cap.prefix, len(cap.excluded), cap.excluded)).fetchone()
    assert row is not None
    topics, held = int(str(row[0])), int(str(row[1]))
    if cap.max_topics is not None and topics_more and topics + topics_more > cap.max_topics:
        raise CapExceeded("max_topics", cap.max_topics, topics, topics_more)
    if cap.max_partitions is not None and held + partitions > cap.max_partitions:
        raise CapExceeded("max_partitions", cap.max_partitions, held, partitions)
