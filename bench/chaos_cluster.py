"""The cluster a chaos run (``bench/chaos.py``) breaks: brokers on one throwaway PostgreSQL,
each on a port of its own that it keeps across restarts (clients find it again where it
was), its log lines kept in a file per broker for the run, and the faults as operations:
kill -9, SIGTERM, SIGSTOP/SIGCONT of a broker, a broker cut off from the database (each
reaches it through a proxy of its own: ``tests/pg_proxy.py``), a restart of the database,
SIGSTOP/SIGCONT of the database's processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

from bench.brokers import EdgeBroker
from bench.cluster import BrokerGroup
from bench.cluster_db import children, postmaster_pid
from edge.local_postgres import free_port
from tests.pg_proxy import PgProxy

if TYPE_CHECKING:
    from tests.postgres_server import PostgresServer

START_TIMEOUT_S = 90.0
"""How long a (re)started broker may take to listen (a loaded two-core machine)."""


class LoggedBroker(EdgeBroker):
    """A broker whose every log line is appended to ``log`` too (one file per broker id for
    the whole run, each start marked)."""

    def __init__(self, settings: dict[str, str], log: Path) -> None:
        super().__init__(settings)
        self.log = log
        self._out: IO[str] | None = None
        self._lock = threading.Lock()

    def start(self, cpus: frozenset[int] | None, timeout: float = START_TIMEOUT_S) -> None:
        self._out = self.log.open("a", encoding="utf-8")
        self._out.write(f"=== chaos: start at {time.time():.3f}\n")
        self._out.flush()
        super().start(cpus, timeout)

    def _on_line(self, line: str, ready: threading.Event) -> None:
        with self._lock:
            if self._out is not None:
                self._out.write(line if line.endswith("\n") else line + "\n")
                self._out.flush()
        super()._on_line(line, ready)

    def note(self, what: str) -> None:
        """A line of the harness's own in the broker's log (what was done to it)."""
        with self._lock:
            if self._out is not None:
                self._out.write(f"=== chaos: {what} at {time.time():.3f}\n")
                self._out.flush()

    def signal(self, signum: signal.Signals) -> None:
        """Send ``signum`` to the broker process."""
        self.note(signum.name)
        os.kill(self.pid, signum)

    def exit_code(self) -> int | None:
        """The process's exit status (None while it runs)."""
        return None if self.proc is None else self.proc.poll()

    def stop(self, timeout: float = 20.0) -> None:
        with contextlib.suppress(OSError):  # never leave it stopped: SIGTERM would wait
            if self.alive():
                os.kill(self.pid, signal.SIGCONT)
        super().stop(timeout)
        with self._lock:
            if self._out is not None:
                self._out.write(f"=== chaos: exited ({self.exit_code()}) at {time.time():.3f}\n")
                self._out.close()
                self._out = None


class ChaosCluster(BrokerGroup):
    """``count`` brokers on database ``url``, with ``settings``; logs under ``log_dir``."""

    def __init__(self, server: PostgresServer, count: int, settings: dict[str, str],
                 log_dir: Path) -> None:
        self.server = server
        self.ports = [free_port() for _ in range(count)]
        self.log_dir = log_dir
        url = server.new_database_url()
        self.proxies = [PgProxy(url) for _ in range(count)]
        """Each broker's way to the database (its ``storageUrl``), which a fault cuts."""
        super().__init__(url, count, settings)

    def member(self, broker_id: int) -> LoggedBroker:
        return LoggedBroker({"storageUrl": self.proxies[broker_id].url,
                             "brokerId": str(broker_id),
                             "kafkaListeners": f"PLAINTEXT://127.0.0.1:{self.ports[broker_id]}",
                             **self.settings}, self.log_dir / f"broker-{broker_id}.log")

    def broker(self, broker_id: int) -> LoggedBroker:
        """The current process of broker ``broker_id``."""
        member = self.members[broker_id]
        assert isinstance(member, LoggedBroker)
        return member

    @property
    def bootstrap(self) -> str:
        """Every broker's port, up or not: they keep their ports."""
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def restart(self, broker_id: int) -> None:
        """Start broker ``broker_id`` again (after reaping the old process), same port."""
        self.broker(broker_id).stop()
        self.members[broker_id] = fresh = self.member(broker_id)
        fresh.start(None, START_TIMEOUT_S)

    def kill(self, broker_id: int) -> None:
        """kill -9, and wait for the process to be gone."""
        member = self.broker(broker_id)
        member.signal(signal.SIGKILL)
        assert member.proc is not None
        member.proc.wait(30)

    def cut_off(self, broker_id: int, held_s: float) -> int:
        """Cut broker ``broker_id`` off from the database for ``held_s`` while the others
        reach it: what it sends still runs there, no answer comes back; then its waiting
        connections are dropped (outcomes it never learns) and it may connect again. How
        many connections were dropped."""
        proxy = self.proxies[broker_id]
        self.broker(broker_id).note(f"cut off from the database for {held_s:.1f} s")
        proxy.hold()
        try:
            time.sleep(held_s)
            return proxy.cut()
        finally:
            proxy.release()

    def stop(self, timeout: float = 20.0) -> None:
        try:
            super().stop(timeout)
        finally:
            for proxy in self.proxies:
                proxy.close()

    def terminate(self, broker_id: int) -> int | None:
        """SIGTERM and wait for the exit (SIGKILL after 20 s); the exit status."""
        member = self.broker(broker_id)
        member.note("SIGTERM")
        member.stop()
        return member.exit_code()

    # -- the database -----------------------------------------------------------------------

    def restart_database(self, down_s: float) -> None:
        """Stop PostgreSQL (fast shutdown: open transactions rolled back, connections
        closed), leave it down ``down_s``, start it on the same port."""
        self.server.stop("fast")
        time.sleep(down_s)
        self.server.start()

    def database_processes(self) -> list[int]:
        """The postmaster's children: every backend and background process."""
        return children(postmaster_pid(self.server))

    def pause_database(self, paused_s: float) -> int:
        """SIGSTOP every backend of the server for ``paused_s``, then SIGCONT; how many."""
        pids = self.database_processes()
        try:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            time.sleep(paused_s)
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        return len(pids)
