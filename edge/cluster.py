"""``edge-broker cluster``: a throwaway PostgreSQL and N brokers on it, until Ctrl-C.

It starts a local PostgreSQL (``edge.local_postgres``: Debian's server binaries, its own
directory and port), creates the database ``edge``, and starts broker ``i`` (0 to N-1) as
``edge-broker --set brokerId=i --set kafkaListeners=PLAINTEXT://127.0.0.1:<base+i>
--set storageUrl=postgres://...`` after the ``--config`` / ``--set`` given to it. Each
broker's log lines are passed on to stderr behind ``broker i |``. Once every broker logged
its ready line (``edge.ready_line``), the bootstrap address is printed on stdout as one
line, ``host:port,host:port,...``. A broker that exits meanwhile is reported with its exit
code; the others keep running. SIGINT or SIGTERM stops the brokers (SIGTERM, then SIGKILL
after :data:`STOP_TIMEOUT`), then PostgreSQL, and removes its directory unless it was
given with ``--data-dir``. A broker that cannot start stops everything (exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Literal, TextIO

from broker_core.storage import StorageError, open_storage
from broker_core.storage.dir_lock import DataDirLock, DataDirLocked
from edge.config import ConfigError, load_config
from edge.local_postgres import LocalPostgres, PostgresError
from edge.ready_line import Ready, parse_ready

DATABASE = "edge"
"""The database the brokers share."""

READY_TIMEOUT = 120.0
"""Seconds a broker has to log its ready line."""

STOP_TIMEOUT = 30.0
"""Seconds the brokers have to stop after SIGTERM before they are killed."""

_PR_SET_PDEATHSIG = 1
_PREFIX = "edge-broker cluster:"


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``cluster`` subcommand's options."""
    parser.add_argument("--brokers", type=int, default=3, metavar="N",
                        help="how many brokers (default: 3)")
    parser.add_argument("--base-port", type=int, default=9092, metavar="PORT",
                        help="broker i listens on PORT+i (default: 9092; 0: free ports)")
    parser.add_argument("--data-dir", metavar="DIR",
                        help="PostgreSQL's directory, kept at exit and used again by the next "
                             "run (default: a temporary one, removed at exit)")
    parser.add_argument("--config", metavar="FILE",
                        help="a properties file every broker reads")
    parser.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                        dest="overrides", help="a setting for every broker (repeatable)")


@dataclass
class _Broker:
    """One broker child process and what the cluster knows of it."""

    broker_id: int
    proc: subprocess.Popen[str]
    ready: Ready | None = None
    stopping: bool = False


@dataclass(frozen=True)
class _Event:
    """What the main loop waits for: a broker ready or gone, or a stop signal."""

    kind: Literal["ready", "exited", "signal"]
    broker_id: int = -1
    ready: Ready | None = None
    code: int = 0


def _die_with_parent() -> Callable[[], None]:
    """A function to run in a broker child before exec (made in the parent, so the child
    only calls ``prctl``): the child gets SIGTERM when the cluster process dies, even by
    ``kill -9``."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    return arm


def prepare_schema(url: str) -> None:
    """Migrate the database's schema before any broker starts: a broker that created the
    schema drops it again when its own start fails, under the brokers that use it."""
    try:
        open_storage(url).close()
    except (StorageError, OSError, ValueError) as exc:
        raise PostgresError(f"cannot prepare database {DATABASE}: {exc}") from exc


class Cluster:
    """The PostgreSQL server and the brokers of one ``edge-broker cluster`` run."""

    def __init__(self, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
        self.count: int = args.brokers
        self.base_port: int = args.base_port
        self.config: str | None = args.config
        self.overrides: list[str] = list(args.overrides)
        self.kept_dir = Path(args.data_dir).resolve() if args.data_dir else None
        self.out, self.err = out, err
        self.events: queue.SimpleQueue[_Event] = queue.SimpleQueue()
        self.server: LocalPostgres | None = None
        self.brokers: list[_Broker] = []
        self._write_lock = threading.Lock()
        self._readers: list[threading.Thread] = []
        self._dir_lock: DataDirLock | None = None

    def say(self, text: str) -> None:
        """One line of our own on stderr."""
        self._line(f"{_PREFIX} {text}")

    def _line(self, line: str) -> None:
        with self._write_lock:
            self.err.write(line + "\n")
            self.err.flush()

    def broker_settings(self, broker_id: int, url: str) -> list[str]:
        """The ``--set`` values that make broker ``broker_id`` a member of this cluster."""
        port = self.base_port + broker_id if self.base_port else 0
        return [f"brokerId={broker_id}", f"kafkaListeners=PLAINTEXT://127.0.0.1:{port}",
                f"storageUrl={url}"]

    def check_arguments(self) -> str | None:
        """What is wrong with the options or with a broker's configuration, if anything."""
        if self.count < 1:
            return "--brokers must be at least 1"
        if self.base_port < 0 or self.base_port + self.count - 1 > 65535:
            return f"--base-port {self.base_port}: the brokers' ports must be within 1-65535"
        try:  # broker 0's settings, with a URL of the form the server's will have
            load_config(self.config, [*self.overrides, *self.broker_settings(
                0, f"postgres://edge@127.0.0.1:5432/{DATABASE}")])
        except ConfigError as exc:
            return f"configuration error: {exc}"
        return None

    def on_signal(self, _signum: int, _frame: FrameType | None) -> None:
        """SIGINT / SIGTERM: ask the main loop to stop (SimpleQueue.put is reentrant)."""
        self.events.put(_Event("signal"))

    def start_postgres(self) -> str:
        """Start PostgreSQL (initialised if new) and create the database; return its URL."""
        if self.kept_dir is None:
            server = self.server = LocalPostgres.throwaway()
        else:
            self.kept_dir.mkdir(parents=True, exist_ok=True)
            try:  # held until we exit: the kernel drops it even on kill -9
                self._dir_lock = DataDirLock(self.kept_dir)
            except DataDirLocked as exc:
                raise PostgresError(f"{self.kept_dir} is in use by another edge-broker "
                                    f"cluster (pid {exc.owner})") from None
            server = self.server = LocalPostgres(self.kept_dir)
            if server.is_running():  # its owner is gone: it does not hold the lock
                self.say(f"stopping the PostgreSQL server left running in {server.root}")
                server.stop()
        if not server.initialised:
            server.init()
        server.start()
        url = server.create_database(DATABASE, exist_ok=True)
        prepare_schema(url)
        pid = (server.data / "postmaster.pid").read_text().split("\n", 1)[0]
        self.say(f"PostgreSQL on 127.0.0.1:{server.port} (pid {pid}), database {DATABASE}, "
                 f"in {server.root}")
        return url

    def start_brokers(self, url: str) -> None:
        """Start every broker, then one thread per broker passing its log on."""
        command = [sys.executable, "-m", "edge.cli"]
        arm = _die_with_parent()
        if self.config:
            command += ["--config", self.config]
        for setting in self.overrides:
            command += ["--set", setting]
        for broker_id in range(self.count):
            args = list(command)
            for setting in self.broker_settings(broker_id, url):
                args += ["--set", setting]
            proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=arm)
            self.brokers.append(_Broker(broker_id, proc))
            self.say(f"broker {broker_id} started (pid {proc.pid})")
        for broker in self.brokers:
            reader = threading.Thread(target=self._pass_log_on, args=(broker,), daemon=True)
            reader.start()
            self._readers.append(reader)

    def _pass_log_on(self, broker: _Broker) -> None:
        """Copy a broker's log lines to stderr; report its ready line and its exit."""
        assert broker.proc.stdout is not None
        for line in broker.proc.stdout:
            line = line.rstrip("\n")
            self._line(f"broker {broker.broker_id} | {line}")
            ready = parse_ready(line)
            if ready is not None:
                self.events.put(_Event("ready", broker.broker_id, ready))
        self.events.put(_Event("exited", broker.broker_id, code=broker.proc.wait()))

    def wait_until_ready(self) -> Literal["ready", "signal", "failed"]:
        """Wait for every broker's ready line: ``ready``, or ``signal`` on a stop signal,
        or ``failed`` when a broker exited first or the time is up (said on stderr)."""
        deadline = time.monotonic() + READY_TIMEOUT
        while any(b.ready is None for b in self.brokers):
            try:
                event = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                late = [str(b.broker_id) for b in self.brokers if b.ready is None]
                self.say(f"broker {', '.join(late)} not ready after {READY_TIMEOUT:.0f} s; "
                         "stopping")
                return "failed"
            if event.kind == "signal":
                return "signal"
            if event.kind == "ready":
                self.brokers[event.broker_id].ready = event.ready
            elif event.kind == "exited":
                self.say(f"broker {event.broker_id} exited with code {event.code} before it "
                         "was ready; stopping")
                return "failed"
        return "ready"

    def bootstrap(self) -> str:
        """The first listener's advertised address of every broker, comma-separated."""
        return ",".join(b.ready.listeners[0].advertised for b in self.brokers
                        if b.ready is not None and b.ready.listeners)

    def serve(self) -> bool:
        """Report brokers that exit until a stop signal (True) or until none is left
        (False)."""
        running = {b.broker_id for b in self.brokers if b.proc.poll() is None}
        while running:
            event = self.events.get()
            if event.kind == "signal":
                return True
            if event.kind == "exited":
                running.discard(event.broker_id)
                self.say(f"broker {event.broker_id} exited unexpectedly with code "
                         f"{event.code}; {len(running)} still running")
        self.say("no broker is left; stopping")
        return False

    def stop_brokers(self) -> bool:
        """SIGTERM every broker, wait, kill what is left; True if all exited with 0."""
        for broker in self.brokers:
            if broker.proc.poll() is None:
                broker.stopping = True
                broker.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        clean = True
        for broker in self.brokers:
            try:
                code = broker.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"broker {broker.broker_id} did not stop within "
                         f"{STOP_TIMEOUT:.0f} s; killing it")
                broker.proc.kill()
                code = broker.proc.wait()
            if broker.stopping and code != 0:
                self.say(f"broker {broker.broker_id} stopped with code {code}")
            clean = clean and broker.stopping and code == 0
        for reader in self._readers:
            reader.join(5)
        return clean

    def stop_postgres(self) -> bool:
        """Stop PostgreSQL and remove its directory unless it is kept; True on success."""
        server = self.server
        if server is None:
            return True
        try:
            server.stop()
        except PostgresError as exc:
            self.say(f"cannot stop PostgreSQL: {exc}")
            return False
        finally:
            if self.kept_dir is None:
                server.remove()
            if self._dir_lock is not None:
                self._dir_lock.release()
        return True

    def run(self) -> int:
        """Start everything, serve until a stop signal, stop everything; the exit code."""
        asked_to_stop = False
        try:
            url = self.start_postgres()
            asked_to_stop = self._signalled()
            if not asked_to_stop:
                self.start_brokers(url)
                state = self.wait_until_ready()
                asked_to_stop = state == "signal"
                if state == "ready":
                    print(self.bootstrap(), file=self.out, flush=True)
                    self.say(f"{self.count} broker(s) ready; Ctrl-C stops them")
                    asked_to_stop = self.serve()
        except PostgresError as exc:
            self.say(f"cannot start PostgreSQL: {exc}")
        finally:
            brokers_clean = self.stop_brokers()
            postgres_clean = self.stop_postgres()
            self.say("stopped")
        return 0 if asked_to_stop and brokers_clean and postgres_clean else 1

    def _signalled(self) -> bool:
        """Whether a stop signal came (consuming the queue; only signals are in it yet)."""
        signalled = False
        with contextlib.suppress(queue.Empty):
            while True:
                signalled = self.events.get_nowait().kind == "signal" or signalled
        return signalled


def run_cluster(args: argparse.Namespace) -> int:
    """Run ``edge-broker cluster``; exit 2 on bad options, 1 if something failed."""
    cluster = Cluster(args, sys.stdout, sys.stderr)
    problem = cluster.check_arguments()
    if problem is not None:
        print(f"{_PREFIX} {problem}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, cluster.on_signal)
    signal.signal(signal.SIGTERM, cluster.on_signal)
    return cluster.run()
