"""A throwaway PostgreSQL server for tests, from Debian's server binaries: ``initdb`` into a
temporary directory, ``pg_ctl start`` on a free 127.0.0.1 port with its own socket
directory, no system service. PostgreSQL refuses to run as root, so as root it runs as the
``postgres`` user the Debian package creates (``runuser``).

One server serves the whole test session (``shared_server``, stopped by ``conftest`` at
the end); each user of it gets a fresh database (``new_database_url``).
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from tests.ports import free_port

SUPERUSER = "edge"
_RUN_AS = "postgres"


def server_bin_dir() -> Path:
    """The newest ``/usr/lib/postgresql/N/bin`` (Debian's layout)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name))
    if not found:
        raise RuntimeError("PostgreSQL server binaries not found (Debian package `postgresql`)")
    return Path(found[-1]).parent


class PostgresServer:
    """One PostgreSQL server in its own directory; ``start`` / ``stop`` / ``restart``."""

    def __init__(self) -> None:
        self.bin = server_bin_dir()
        self.root = Path(tempfile.mkdtemp(prefix="edge-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self._as_root = os.geteuid() == 0
        self._names = itertools.count()
        if self._as_root:
            user = pwd.getpwnam(_RUN_AS)
            os.chown(self.root, user.pw_uid, user.pw_gid)

    def _run(self, *args: str) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if self._as_root:
            command = ["runuser", "-u", _RUN_AS, "--", *command]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=120)

    def init(self) -> PostgresServer:
        self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust",
                  "--no-sync", "-E", "UTF8", "--locale=C")
        return self

    def start(self) -> PostgresServer:
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} "
                   f"-c unix_socket_directories={self.root} -c fsync=on")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"),
                  "-o", options, "-w", "-t", "60", "start")
        return self

    def stop(self) -> None:
        if not (self.data / "postmaster.pid").exists():
            return  # not running
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    @classmethod
    def running(cls) -> PostgresServer:
        """A new server, initialised and started; on a failed start it is stopped (if it
        came up anyway) and its directory removed before the error is raised."""
        server = cls()
        try:
            return server.init().start()
        except BaseException:
            try:
                server.stop()
            finally:
                server.remove()
            raise

    def url(self, database: str) -> str:
        return f"postgres://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def new_database_url(self) -> str:
        """The URL of a new, empty database on this server."""
        name = f"t{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}".encode())
        return self.url(name)


@contextmanager
def own_server() -> Iterator[PostgresServer]:
    """A server of its own (to stop and start under a broker), removed afterwards."""
    server = PostgresServer.running()
    try:
        yield server
    finally:
        try:
            server.stop()
        finally:
            server.remove()


_shared: list[PostgresServer] = []


def shared_server() -> PostgresServer:
    """The session's server, initialised and started on first use."""
    if not _shared:
        server = PostgresServer.running()
        _shared.append(server)
    return _shared[0]


def stop_shared_server() -> None:
    """Stop and remove the session's server, if one was started."""
    while _shared:
        server = _shared.pop()
        try:
            server.stop()
        finally:
            server.remove()
