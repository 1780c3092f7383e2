"""The PostgreSQL engine's connection pool and the one way its statements run.

A database error becomes :class:`DatabaseUnavailable` (an OSError: clients get retriable
errors); connection trouble and other refusals are two causes, each logged once by the
write-fault log (``storage_faults``).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import psycopg
import psycopg_pool

from .errors import DatabaseUnavailable, LogClosed
from .pg_schema import drop_schema, migrate

Conn = psycopg.Connection[tuple[object, ...]]
"""A connection whose rows are tuples."""

_CONNECT_TIMEOUT_S = 5
_CHECKOUT_TIMEOUT_S = 1.0
"""How long a statement waits for a pooled connection: while the database is away, a
write fails after this (a retriable error) instead of holding its caller."""
_STATEMENT_TIMEOUT_MS = 5000
"""Longest a statement, or an unanswered send to the database host, may take."""

logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
"""The pool's own warnings repeat on every reconnection attempt; the write-fault log says
it once per cause (``storage_faults``)."""


def unavailable(exc: Exception) -> DatabaseUnavailable:
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
            raise unavailable(exc) from None
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
            raise unavailable(exc) from None

    def statement(self, sql: str, params: Mapping[str, object]) -> int:
        """Run one statement as its own transaction (one round trip: the pool's
        connections autocommit); the rows it changed."""
        try:
            with self._pool.connection() as conn:
                return conn.execute(sql.encode(), params).rowcount
        except psycopg_pool.PoolClosed:
            raise LogClosed("the storage is closed") from None
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise unavailable(exc) from None

    def close(self, *, drop: bool = False) -> None:
        if drop:
            with self._pool.connection() as conn:
                drop_schema(conn)
        self._pool.close()
