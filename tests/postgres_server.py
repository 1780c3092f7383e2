"""The test session's PostgreSQL server: one throwaway :class:`LocalPostgres`
(``edge/local_postgres.py``, the server ``edge-broker cluster`` runs on too) serves the
whole session (``shared_server``, stopped by ``conftest`` at the end); each user of it gets
a fresh database (``new_database_url``). A session that was killed leaves its server
behind; the next session's first server stops and removes it.
"""

from __future__ import annotations

from edge.local_postgres import LocalPostgres

PostgresServer = LocalPostgres
"""A server of a test's own (``PostgresServer.running()``), to stop and start at will."""

_shared: list[LocalPostgres] = []


def shared_server() -> LocalPostgres:
    """The session's server, initialised and started on first use."""
    if not _shared:
        _shared.append(LocalPostgres.running())
    return _shared[0]


def stop_shared_server() -> None:
    """Stop and remove the session's server, if one was started."""
    while _shared:
        server = _shared.pop()
        try:
            server.stop()
        finally:
            server.remove()
