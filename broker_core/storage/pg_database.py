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

POOL_SIZE = 10
"""Connections at most: the event loop's statements, the group commit's lanes
(``pg_commits``), the read-ahead workers (``pg_readahead``), the marker relay's poll and
the cluster's heartbeats never wait for one another. With the notification connection
(:func:`connect_listener`) a broker holds this plus one (the README's ``max_connections``
budget, which ``tests/operations/test_readme.py`` keeps equal)."""
_CONNECT_TIMEOUT_S = 5
_CHECKOUT_TIMEOUT_S = 1.0
"""How long a statement waits for a pooled connection: while the database is away, a
write fails after this (a retriable error) instead of holding its caller."""
_STATEMENT_TIMEOUT_MS = 5000
"""Longest a statement, or an unanswered send to the database host, may take."""
_IDLE_IN_TRANSACTION_MS = _STATEMENT_TIMEOUT_MS // 2
"""Longest a transaction may wait for its next statement (its statements follow one
another from one thread): shorter than a statement's timeout, so that a statement waiting
for the locks of a stopped broker's transaction gets them before it times out."""

_SESSION: dict[str, object] = {
    "connect_timeout": _CONNECT_TIMEOUT_S, "autocommit": True,
    # a database host that stops answering must not hold the event loop until TCP gives
    # up: statements and silent peers time out
    "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 2,
    "tcp_user_timeout": _STATEMENT_TIMEOUT_MS,
    # a broker stopped (SIGSTOP, a VM pause) between two statements of a transaction keeps
    # its connection alive, and its row locks with it: the server ends such a session.
    # No JIT: every statement here reads or writes a few rows by key, and a plan that the
    # planner costs high (a lateral join per segment, say) would spend 30-200 ms
    # compiling itself to run in 1 ms
    "options": f"-c statement_timeout={_STATEMENT_TIMEOUT_MS}"
               f" -c idle_in_transaction_session_timeout={_IDLE_IN_TRANSACTION_MS}"
               " -c jit=off"}
"""Connection settings of every connection to the storage database."""

logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
"""The pool's own warnings repeat on every reconnection attempt; the write-fault log says
it once per cause (``storage_faults``)."""


_CONNECTION_STATES = ("08", "57P01", "57P02", "57P03")
"""SQLSTATEs (or their class) of a connection lost or refused, or a server shutting down
or starting; a statement the server ended (a deadlock, a serialization failure, a
timeout) is an error of that statement, not a database out of reach."""


def unavailable(exc: Exception) -> DatabaseUnavailable:
    """The OSError for a database failure: connection trouble and other refusals are two
    causes (each logged once by the write-fault log)."""
    lost = isinstance(exc, psycopg_pool.PoolTimeout) or (
        isinstance(exc, psycopg.OperationalError)
        and (exc.sqlstate is None or exc.sqlstate.startswith(_CONNECTION_STATES)))
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    code = errno.ECONNREFUSED if lost else errno.EIO
    return DatabaseUnavailable(code, f"PostgreSQL {'unreachable' if lost else 'error'}: {first}")


READER_NAME = "edge-broker reader"
"""The ``application_name`` of read-only connections (as ``pg_stat_activity`` shows them)."""


def connect_read_only(conninfo: str) -> Conn:
    """One connection that can only read, with the pool's timeouts: for a tool that reads
    the cluster's database (no migration, no writes). DatabaseUnavailable if it fails."""
    try:
        return psycopg.connect(conninfo, **{  # type: ignore[arg-type]
            **_SESSION, "application_name": READER_NAME,
            "options": f"{_SESSION['options']} -c default_transaction_read_only=on"})
    except psycopg.Error as exc:
        raise unavailable(exc) from None


LISTENER_NAME = "edge-broker listener"
"""The ``application_name`` of a broker's notification connection (``pg_listen``)."""


def connect_listener(conninfo: str) -> Conn:
    """The dedicated connection notifications arrive on (autocommit, the pool's timeouts
    and keepalives, so a database host that vanishes is noticed while it waits)."""
    return psycopg.connect(conninfo, **{  # type: ignore[arg-type]
        **_SESSION, "application_name": LISTENER_NAME})


class Database:
    """The connection pool and the one way statements run: a transaction that commits on
    success, with database errors turned into :class:`DatabaseUnavailable`."""

    def __init__(self, conninfo: str, where: str) -> None:
        self.where = where
        self.conninfo = conninfo
        try:
            with psycopg.connect(conninfo, connect_timeout=_CONNECT_TIMEOUT_S) as conn:
                self.found_version = migrate(conn, where)
        except psycopg.Error as exc:
            raise unavailable(exc) from None
        self._pool = psycopg_pool.ConnectionPool(
            conninfo, min_size=1, max_size=POOL_SIZE, timeout=_CHECKOUT_TIMEOUT_S, open=True,
            kwargs=_SESSION,
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

    @contextmanager
    def autocommit(self) -> Iterator[Conn]:
        """A connection outside any transaction: each statement commits alone, in one
        round trip (no BEGIN and COMMIT around it). For reads that need no snapshot across
        statements (committed entries never change) and single-statement writes."""
        try:
            with self._pool.connection() as conn:
                yield conn
        except psycopg_pool.PoolClosed:
            raise LogClosed("the storage is closed") from None
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise unavailable(exc) from None

    def statement(self, sql: str, params: Mapping[str, object]) -> int:
        """Run one statement as its own transaction (one round trip: the pool's
        connections autocommit); the rows it changed."""
        with self.autocommit() as conn:
            return conn.execute(sql.encode(), params).rowcount

    def close(self, *, drop: bool = False) -> None:
        if drop:
            with self._pool.connection() as conn:
                drop_schema(conn)
        self._pool.close()
