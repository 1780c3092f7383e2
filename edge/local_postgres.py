"""A local PostgreSQL server of our own, from Debian's server binaries: ``initdb`` into a
directory, ``pg_ctl start`` on a 127.0.0.1 port with the socket in that directory, no
system service. PostgreSQL refuses to run as root, so as root it runs as the ``postgres``
user the Debian package creates (``runuser``).

``edge-broker cluster`` runs its brokers on one, and the tests run on one too
(``tests/postgres_server.py``). Two things make it safe to use from processes that may
die without cleaning up:

- a *throwaway* server lives in a directory under :data:`THROWAWAY_ROOT` whose name holds
  its owner's pid and start time; every new throwaway server first stops and removes those
  whose owner is gone (a test run or a cluster that was ``kill -9``-ed), and a kept
  directory (``edge-broker cluster --data-dir``) stops a server left running in it before
  starting its own;
- a port chosen by the server is chosen again if another process took it between the
  choice and the server's bind (an explicit port, or a restart, keeps its port).
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import psycopg

SUPERUSER = "edge"
"""The superuser ``initdb`` creates (trust authentication on 127.0.0.1 and the socket)."""

RUN_AS = "postgres"
"""The unprivileged user the server runs as when we are root (Debian's package makes it)."""

THROWAWAY_ROOT = Path(tempfile.gettempdir()) / f"edge-postgres-{os.getuid()}"
"""Where throwaway servers live, one directory each, named ``<pid>-<start>-<random>``."""

PORT_ATTEMPTS = 5
"""How many ports a server that chooses its own port tries before giving up."""

_PORT_TAKEN = ("Address already in use", "could not create any TCP/IP sockets")
_LOG_LINES = 5


class PostgresError(RuntimeError):
    """A server could not be initialised, started or stopped; the message says why."""


def server_bin_dir() -> Path:
    """The newest ``/usr/lib/postgresql/N/bin`` (Debian's layout)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name))
    if not found:
        raise PostgresError("PostgreSQL server binaries not found (Debian package "
                            "`postgresql`; `make cluster` installs it)")
    return Path(found[-1]).parent


def free_port() -> int:
    """A port on 127.0.0.1 that is free now (another process may take it before use)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; fields 1-2 end at ")"


def _owner_alive(directory: Path) -> bool:
    """Whether the process named in a throwaway directory's name still runs."""
    pid, _, rest = directory.name.partition("-")
    started, _, _ = rest.partition("-")
    return pid.isdigit() and _start_time(int(pid)) == started


def reap_orphans(root: Path = THROWAWAY_ROOT) -> list[Path]:
    """Stop and remove the throwaway servers under ``root`` whose owner is gone; return
    their directories."""
    reaped = []
    with contextlib.suppress(FileNotFoundError):
        for directory in sorted(root.iterdir()):
            if directory.is_dir() and not _owner_alive(directory):
                # another process may be reaping it at the same time: its errors are ours
                with contextlib.suppress(PostgresError, OSError):
                    LocalPostgres(directory).discard()
                reaped.append(directory)
    return reaped


class LocalPostgres:
    """One PostgreSQL server in ``root`` (data in ``root/data``, its log in
    ``root/server.log``, its socket in ``root``): ``init`` / ``start`` / ``stop`` /
    ``remove``, and databases to hand to brokers."""

    def __init__(self, root: Path, port: int = 0,
                 pick_port: Callable[[], int] = free_port) -> None:
        self.bin = server_bin_dir()
        self.root = root
        self.data = root / "data"
        self.log_file = root / "server.log"
        self.port = port
        """The server's port; 0 until the first start chooses one."""
        self._pick_port = pick_port
        self._as_root = os.geteuid() == 0
        self._names = itertools.count()

    @classmethod
    def throwaway(cls, pick_port: Callable[[], int] = free_port) -> LocalPostgres:
        """A server in a new directory under :data:`THROWAWAY_ROOT`, owned by this
        process (after reaping the servers of owners that are gone)."""
        reap_orphans()
        THROWAWAY_ROOT.mkdir(mode=0o755, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-{_start_time(os.getpid())}-",
                                     dir=THROWAWAY_ROOT))
        return cls(root, pick_port=pick_port)

    @classmethod
    def running(cls, pick_port: Callable[[], int] = free_port) -> LocalPostgres:
        """A throwaway server, initialised and started; on a failed start it is stopped
        (if it came up anyway) and its directory removed before the error is raised."""
        server = cls.throwaway(pick_port)
        try:
            return server.init().start()
        except BaseException:
            server.discard()
            raise

    @property
    def initialised(self) -> bool:
        """Whether ``root/data`` holds a database cluster already."""
        return (self.data / "PG_VERSION").exists()

    def _run(self, *args: str, timeout: float = 120) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if self._as_root:
            command = ["runuser", "-u", RUN_AS, "--", *command]
        try:
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, timeout=timeout)
        except subprocess.CalledProcessError as exc:
            what = f"pg_ctl {args[-1]}" if args[0] == "pg_ctl" else args[0]
            reason = " ".join((exc.stderr or "").split("\n")).strip()
            if self._as_root and "Permission denied" in reason:
                reason += (f" (as root, the server runs as user {RUN_AS}, who must be able "
                           "to reach the directory)")
            raise PostgresError(f"{what} failed: {reason}") from exc

    def init(self) -> LocalPostgres:
        """``initdb`` the data directory (creating ``root``, owned by the server's user)."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self._as_root:
            user = pwd.getpwnam(RUN_AS)
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust",
                  "--no-sync", "-E", "UTF8", "--locale=C")
        return self

    def start(self) -> LocalPostgres:
        """Start the server and wait until it accepts connections. A server that chose
        its port takes another one (up to :data:`PORT_ATTEMPTS`) when that one was taken
        meanwhile; a port given, or kept from an earlier start, is used as it is."""
        chosen = self.port == 0
        attempt = 0
        while True:
            attempt += 1
            if chosen:
                self.port = self._pick_port()
            logged = self.log_file.stat().st_size if self.log_file.exists() else 0
            try:
                self._start_on(self.port)
                return self
            except PostgresError as exc:
                if not (chosen and attempt < PORT_ATTEMPTS and self._port_was_taken(logged)):
                    if chosen:
                        self.port = 0
                    raise PostgresError(f"{exc}; server log: {self._log_since(logged)}") from exc

    def _log_since(self, since: int) -> str:
        """The server log from byte ``since`` on, its last lines joined by `` | ``."""
        try:
            with self.log_file.open("rb") as log:
                log.seek(since)
                lines = log.read().decode(errors="replace").splitlines()
        except OSError:
            return "(none)"
        return " | ".join(lines[-_LOG_LINES:]) or "(empty)"

    def _start_on(self, port: int) -> None:
        options = (f"-c listen_addresses=127.0.0.1 -p {port} "
                   f"-c unix_socket_directories={self.root} -c fsync=on")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log_file),
                  "-o", options, "-w", "-t", "60", "start")

    def _port_was_taken(self, since: int) -> bool:
        """Whether the server log, from byte ``since`` on, says the port was in use."""
        text = self._log_since(since)
        return any(reason in text for reason in _PORT_TAKEN)

    def is_running(self) -> bool:
        """Whether a server runs on the data directory (``pg_ctl status``)."""
        if not (self.data / "postmaster.pid").exists():
            return False
        try:
            self._run("pg_ctl", "-D", str(self.data), "status", timeout=30)
        except PostgresError:
            return False
        return True

    def stop(self, mode: Literal["fast", "immediate"] = "fast") -> None:
        """Stop the server if it runs (``fast``: roll back open transactions and close
        connections; ``immediate``: no shutdown checkpoint, for servers left behind)."""
        if not self.is_running():
            return
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def remove(self) -> None:
        """Delete ``root`` and everything in it."""
        shutil.rmtree(self.root, ignore_errors=True)

    def discard(self) -> None:
        """Stop the server at once (if it runs) and remove its directory."""
        try:
            self.stop("immediate")
        finally:
            self.remove()

    def url(self, database: str) -> str:
        """The ``storageUrl`` of ``database`` on this server."""
        if not self.port:
            raise PostgresError("the server has not been started")
        return f"postgres://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str, exist_ok: bool = False) -> str:
        """Create database ``name`` (a plain identifier); return its URL."""
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                  (name,)).fetchone() is not None
            if exists and not exist_ok:
                raise PostgresError(f"database {name} exists already")
            if not exists:
                conn.execute(f'CREATE DATABASE "{name}"'.encode())
        return self.url(name)

    def new_database_url(self) -> str:
        """The URL of a new, empty database on this server."""
        return self.create_database(f"t{os.getpid()}_{next(self._names)}")
