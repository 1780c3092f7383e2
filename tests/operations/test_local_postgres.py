"""The throwaway PostgreSQL server (``edge/local_postgres.py``) that the tests and
``edge-broker cluster`` run on: a server whose owner was killed is stopped and removed by
the next one, and a port taken between its choice and the server's bind is chosen again."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from edge.local_postgres import LocalPostgres, PostgresError, free_port
from tests.broker_process import REPO

_OWNER = """
from edge.local_postgres import LocalPostgres
server = LocalPostgres.running()
print(server.root, server.port, flush=True)
import time
time.sleep(600)
"""


def accepts_connections(port: int) -> bool:
    """Whether a PostgreSQL server answers on 127.0.0.1:``port``."""
    try:
        with psycopg.connect(f"postgres://edge@127.0.0.1:{port}/postgres", connect_timeout=5):
            return True
    except psycopg.OperationalError:
        return False


@contextlib.contextmanager
def listening_socket() -> Iterator[int]:
    """A port that a listening socket on 127.0.0.1 holds meanwhile."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_a_server_whose_owner_was_killed_is_removed_by_the_next_one() -> None:
    owner = subprocess.Popen([sys.executable, "-c", _OWNER], cwd=REPO, text=True,
                             stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert owner.stdout is not None
    root_text, port_text = owner.stdout.readline().split()
    root, port = Path(root_text), int(port_text)
    owner.send_signal(signal.SIGKILL)
    owner.wait(10)
    assert accepts_connections(port)  # left behind by its killed owner
    assert root.exists()
    server = LocalPostgres.running()
    try:
        assert not accepts_connections(port)
        assert not root.exists()
        assert accepts_connections(server.port)  # the new one is not its own victim
    finally:
        server.discard()
    assert not server.root.exists()


def test_a_port_taken_meanwhile_is_chosen_again() -> None:
    with listening_socket() as taken:
        offered: list[int] = []

        def pick() -> int:
            offered.append(taken if not offered else free_port())
            return offered[-1]

        server = LocalPostgres.running(pick)
        try:
            assert offered[0] == taken and len(offered) == 2
            assert server.port == offered[1]
            assert accepts_connections(server.port)
            url = server.new_database_url()
            server.stop()
            server.start()  # a restart keeps its port: the URLs handed out stay valid
            assert server.port == offered[1]
            with psycopg.connect(url) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
        finally:
            server.discard()


def test_a_port_given_that_is_taken_fails_with_the_reason() -> None:
    with listening_socket() as taken:
        server = LocalPostgres.throwaway()
        server.port = taken
        try:
            server.init()
            with pytest.raises(PostgresError, match=r"pg_ctl start failed.*server log: .*"
                                                    r"Address already in use"):
                server.start()
        finally:
            server.discard()
