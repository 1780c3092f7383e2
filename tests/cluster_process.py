"""Run ``edge-broker cluster`` as a child process for tests: its bootstrap line, and the
pids, ports and directory it names on stderr, to check that everything is gone after."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.broker_process import REPO, ChildProcess

_POSTGRES = re.compile(r"edge-broker cluster: PostgreSQL on 127\.0\.0\.1:(\d+) \(pid (\d+)\), "
                       r"database \w+, in (.+)$")
_BROKER = re.compile(r"edge-broker cluster: broker (\d+) started \(pid (\d+)\)")


class ClusterProcess(ChildProcess):
    """``edge-broker cluster`` with its options; ready once it says its brokers are."""

    ready_pattern = re.compile(r"edge-broker cluster: \d+ broker\(s\) ready")
    what = "cluster"

    def __init__(self, *options: str) -> None:
        super().__init__()
        self.options = options
        self.bootstrap: list[str] = []

    def start(self, timeout: float = 120.0) -> ClusterProcess:
        """Start the command; wait for its brokers and read the bootstrap line."""
        self.spawn([sys.executable, "-m", "edge.cli", "cluster", *self.options], timeout,
                   stdout=subprocess.PIPE)
        assert self.proc is not None and self.proc.stdout is not None
        self.bootstrap = self.proc.stdout.readline().strip().split(",")
        return self

    def run(self, timeout: float = 120.0) -> int:
        """Run the command to its end (one that does not become ready); its exit code."""
        result = subprocess.run([sys.executable, "-m", "edge.cli", "cluster", *self.options],
                                cwd=REPO, capture_output=True, text=True, timeout=timeout)
        self.lines = result.stderr.splitlines()
        self.bootstrap = result.stdout.split()
        return result.returncode

    def postgres(self) -> tuple[int, int, Path]:
        """PostgreSQL's port, postmaster pid and directory, as the command named them."""
        for line in self.lines:
            match = _POSTGRES.search(line)
            if match:
                return int(match[1]), int(match[2]), Path(match[3])
        raise AssertionError("no PostgreSQL line:\n" + self.log_text())

    def broker_pids(self) -> dict[int, int]:
        """Every broker's pid by broker id."""
        return {int(m[1]): int(m[2]) for m in map(_BROKER.search, self.lines) if m}


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie nobody reaped yet counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")
