"""Run the real broker as a child process on 127.0.0.1 with port 0, for tests; and the
check that a broker given a bad configuration refused to start."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from edge.ready_line import READY_LINE, parse_ready

REPO = Path(__file__).resolve().parent.parent


def refused_to_start(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """``edge.cli`` exited with 2 and a configuration error naming each of ``fragments``,
    without having become ready."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "configuration error" in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)
    assert "edge-broker ready" not in result.stderr


class ChildProcess:
    """A child process whose stderr lines are kept, with a ready line to wait for."""

    ready_pattern: re.Pattern[str]
    what = "child process"

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self._matched = False

    def spawn(self, args: list[str], timeout: float, stdout: int = subprocess.DEVNULL,
              env: Mapping[str, str] | None = None) -> None:
        """Start ``args`` in the repository and wait for the ready line (``stdout``:
        ``subprocess.PIPE`` to read it from ``proc.stdout``; ``env``: variables to add to
        this process's environment). Each start has its own lines and ready event: the
        reader of a process killed just before (a restart) may see its end of file only
        now, and once set the new start's event, failing it at once with no line."""
        lines: list[str] = []
        self.lines = lines
        ready = threading.Event()
        self._matched = False
        self.proc = proc = subprocess.Popen(
            args, cwd=REPO, stderr=subprocess.PIPE, stdout=stdout, text=True,
            env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
        )
        threading.Thread(target=self._drain, args=(proc, lines, ready), daemon=True).start()
        if not ready.wait(timeout) or not self._matched:
            self.kill()
            raise RuntimeError(f"{self.what} did not become ready:\n" + self.log_text())

    def _drain(self, proc: subprocess.Popen[str], lines: list[str],
               ready: threading.Event) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            match = self.ready_pattern.search(line)
            if match:
                self.on_ready(match)
                self._matched = True
                ready.set()
        ready.set()  # stderr closed: the process ended, ready or not (spawn tells)

    def on_ready(self, match: re.Match[str]) -> None:
        """Read what the ready line says."""

    def log_text(self) -> str:
        """Everything the process logged so far."""
        return "\n".join(self.lines)

    def wait_for_log(self, pattern: str, timeout: float = 10.0, after: int = 0) -> str:
        """Wait until a log line (from line ``after`` on) matches ``pattern``; return it."""
        compiled = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines[after:]:
                if compiled.search(line):
                    return line
            time.sleep(0.05)
        raise AssertionError(f"no log line matched {pattern!r}:\n{self.log_text()}")

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; return the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """``kill -9`` the process."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.proc is not None and self.proc.poll() is None


class BrokerProcess(ChildProcess):
    """A broker child process with its data directory, its log lines and its ports."""

    ready_pattern = READY_LINE
    what = "broker"

    def __init__(self, data_dir: Path, settings: dict[str, str] | None = None) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.settings = {
            "kafkaListeners": "PLAINTEXT://127.0.0.1:0",
            "dataDir": str(data_dir),
            **(settings or {}),
        }
        self.ports: dict[str, int] = {}
        self.launcher: list[str] = []
        """A command the broker is started under (``prlimit --nofile=...``)."""

    @property
    def bootstrap(self) -> str:
        """``host:port`` of the first listener."""
        return f"127.0.0.1:{next(iter(self.ports.values()))}"

    @property
    def port(self) -> int:
        """The first listener's bound port."""
        return next(iter(self.ports.values()))

    def start(self, timeout: float = 60.0) -> BrokerProcess:
        """Start the broker and wait for its ready line (a minute: it is ready in a second
        or two, but once in a full run a restarted broker wrote not one line in 30 s, its
        recovery's fsyncs waiting, it seems, behind the other tests' written data)."""
        args = [*self.launcher, sys.executable, "-m", "edge.cli"]
        for key, value in self.settings.items():
            args += ["--set", f"{key}={value}"]
        self.ports = {}
        self.spawn(args, timeout)
        return self

    def on_ready(self, match: re.Match[str]) -> None:
        """Note the bound port of every listener."""
        ready = parse_ready(match[0])
        assert ready is not None
        for listener in ready.listeners:
            self.ports[listener.name] = listener.port
