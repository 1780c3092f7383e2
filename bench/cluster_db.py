"""The PostgreSQL server the cluster rows run on: one throwaway server for the run (initdb
into a temporary directory, its own port, no system service), a fresh database per
cluster, and the CPU time the server's processes took.

:func:`start_postgres` is the one place that starts it (today with the test suite's
``tests/postgres_server.py``), so another way of starting one is a change of this function.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from bench import procstats
from bench.pinning import inherited_affinity

if TYPE_CHECKING:
    from tests.postgres_server import PostgresServer


def start_postgres() -> PostgresServer:
    """A new PostgreSQL server, started, on every CPU (not the load generators' alone)."""
    from tests.postgres_server import PostgresServer

    with inherited_affinity(frozenset(range(os.cpu_count() or 1))):
        return PostgresServer.running()


@contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    """A server for the block; stopped and removed at the end."""
    with ExitStack() as cleanup:
        server = start_postgres()
        cleanup.callback(server.remove)  # last, even when stopping fails
        cleanup.callback(server.stop)
        yield server


def _stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 onwards)."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
        return handle.read().rsplit(")", 1)[1].split()


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int(_stat_fields(int(entry.name))[1]) == pid:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return found


def _reaped_seconds(pid: int) -> float:
    """CPU seconds of ``pid``'s children that have exited and been waited for."""
    fields = _stat_fields(pid)  # cutime and cstime: fields 16 and 17 of proc(5)
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def postmaster_pid(server: PostgresServer) -> int:
    """The pid of the server's postmaster (from its ``postmaster.pid``)."""
    return int((server.data / "postmaster.pid").read_text().split()[0])


def postgres_cpu_seconds(server: PostgresServer) -> float:
    """CPU seconds of the postmaster and every backend so far: the live ones, and the
    ones that exited (the postmaster waits for them, so their time is its children's)."""
    postmaster = postmaster_pid(server)
    total = procstats.cpu_seconds(postmaster) + _reaped_seconds(postmaster)
    for child in children(postmaster):
        try:
            total += procstats.cpu_seconds(child)
        except OSError:
            continue  # exited meanwhile: counted as reaped from now on
    return total
