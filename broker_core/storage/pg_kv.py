"""A key-value area in PostgreSQL: the broker's own (``edge_kv``, shared by every broker
of the database; its writes count in ``pg_changes.KV`` so that the others read it again)
or one partition's (``edge_partition_kv``, written only by the partition's owner at its
epoch).
"""

from __future__ import annotations

from collections.abc import Callable

from . import pg_changes
from .cluster import NotOwner
from .pg_database import Conn, Database

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
            else:
                self._hold_claim(conn)
                conn.execute("INSERT INTO edge_partition_kv VALUES (%s, %s, %s)"
                             " ON CONFLICT (partition_id, key)"
                             " DO UPDATE SET value = excluded.value",
                             (self._scope, key, bytes(value)))

    def _hold_claim(self, conn: Conn) -> None:
        """Only the partition's owner writes its area, at the epoch it holds: the
        partition's row is locked against a claim (which updates it) until the write
        commits, so an owner paused past a takeover cannot overwrite the new owner's
        values (a plain conditional INSERT took no lock a claim waits for)."""
        epoch = self._epoch() if self._epoch is not None else None
        if conn.execute("SELECT 1 FROM edge_partitions WHERE id = %s AND owner_epoch"
                        " = coalesce(%s, owner_epoch) FOR SHARE",
                        (self._scope, epoch)).fetchone() is None:
            raise NotOwner(f"partition {self._scope} is no longer owned here")

    def compare_and_set(self, key: str, expected: bytes | None, value: bytes) -> bool:
        """One conditional statement: a concurrent writer's commit makes the condition
        fail (PostgreSQL re-checks an UPDATE's condition on the row it waited for, and an
        INSERT that meets a row inserted meanwhile does nothing)."""
        self._check()
        statements = _CAS_INSERT if expected is None else _CAS_UPDATE
        with self._db.tx() as conn:
            if self._scope is not None:
                self._hold_claim(conn)
            stored = conn.execute(statements[self._scope is not None], {
                "s": self._scope, "k": key, "v": bytes(value), "e": expected}).rowcount == 1
            if stored and self._scope is None:
                pg_changes.bump(conn, pg_changes.KV)
        return stored
