"""Smoke test of ``python -m bench.connections --quick``: 50 idle connections log in with
SASL/PLAIN tokens on raw sockets, and the row's table and JSON are written (no timing
assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_quick_run_writes_the_row(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "bench.connections", "--quick", "--out",
                          str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         timeout=280, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads((tmp_path / "connections.json").read_text())
    assert result["connections"] == 50
    assert result["rss_after_bytes"] > 0
    for run_result in (result["latency_alone"], result["latency_beside"]):
        assert run_result["errors"] == 0 and run_result["measured"] > 0
    assert "idle SASL/PLAIN (token) connections" in (tmp_path / "connections.md").read_text()
