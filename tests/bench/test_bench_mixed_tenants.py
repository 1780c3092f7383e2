"""Smoke test of ``python -m bench.mixed_tenants --quick``: two tenants, each logged in
over SASL_SSL as itself with its own topic, one producer and one consumer each, end to end
against this broker (no timing assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_quick_run_writes_a_row_per_tenant(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "bench.mixed_tenants", "--quick", "--no-pin",
                          "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         timeout=500, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    results = json.loads((tmp_path / "mixed_tenants.json").read_text())
    assert [row["name"] for row in results["rows"]] == ["tenant-01", "tenant-02"]
    for row in results["rows"]:
        assert row["errors"] == 0, row["first_error"]
        assert row["delivered"] > 0 and row["received"] > 0
        assert row["missing"] == 0
    assert results["broker"]["rss_mb"] > 0
    assert "| **all** |" in (tmp_path / "mixed_tenants.md").read_text()
