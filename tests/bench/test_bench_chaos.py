"""Smoke test of the chaos soak (``python -m bench.chaos``): a quick run of three brokers
on a throwaway PostgreSQL with a few faults (kill -9 and SIGTERM of brokers) under the
idempotent, transactional and group load ends with no violation. (Not the database
faults: a client whose connection drops while its batch is in flight, as a lapsed lease
drops them, may still see a stored batch renumbered by librdkafka's epoch bump and stored
twice; the soak's `--kinds pg_restart` runs show it.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_a_quick_chaos_run_finds_no_violation(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench.chaos", "--minutes", "0.15", "--seed", "7",
         "--gap", "2", "3", "--kinds", "kill9,sigterm", "--rate", "100",
         "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=220, check=False)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "violations: none" in run.stdout
    summary = json.loads((tmp_path / "summary.json").read_text(encoding="utf-8"))
    assert sum(summary["faults"].values()) >= 1  # more when the machine is not loaded
    assert summary["acked"] > 0 and summary["outputs"] == summary["acked"]
    assert (tmp_path / "broker-0.log").exists()
