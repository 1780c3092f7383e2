"""Running ``edge-broker admin`` (and the other subcommands) as a subprocess, the way an
operator's script does: its exit code, stdout and stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.broker_process import REPO


@dataclass
class Ran:
    """What one command did."""

    code: int
    out: str
    err: str

    def json(self) -> Any:
        """Its stdout as JSON."""
        return json.loads(self.out)

    def one_error_line(self) -> str:
        """Its stderr, checked to be one line and no traceback."""
        lines = self.err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in self.err, self.err
        return lines[0]


def edge_broker(*args: str, stdin: str | None = None, timeout: float = 120) -> Ran:
    """``edge-broker ARGS`` run with this interpreter."""
    result = subprocess.run([sys.executable, "-m", "edge.cli", *args], cwd=REPO,
                            capture_output=True, text=True, input=stdin, timeout=timeout)
    return Ran(result.returncode, result.stdout, result.stderr)


def admin(bootstrap: str | None, *args: str, config: Path | None = None, output: str = "table",
          stdin: str | None = None) -> Ran:
    """``edge-broker admin [--bootstrap-server BOOTSTRAP] [--command-config] ARGS``."""
    flags = ["--output", output, "--timeout", "60"]
    if bootstrap is not None:
        flags += ["--bootstrap-server", bootstrap]
    if config is not None:
        flags += ["--command-config", str(config)]
    return edge_broker("admin", *flags, *args, stdin=stdin)


def write_properties(path: Path, **values: str) -> Path:
    """A client properties file (``sasl_username`` is written ``sasl.username``)."""
    path.write_text("".join(f"{key.replace('_', '.')}={value}\n"
                            for key, value in values.items()))
    return path
