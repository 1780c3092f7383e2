"""Smoke test of ``python -m bench.logins --quick``: PLAIN HS256, PLAIN RS256 and
OAUTHBEARER (JWKS) logins and a small login storm, end to end against this broker (no
timing assertions: every login succeeded and every row is there)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_quick_run_writes_every_login_row_and_the_storm(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "bench.logins", "--quick", "--no-pin",
                          "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         timeout=500, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    results = json.loads((tmp_path / "logins.json").read_text())
    assert list(results["rows"]) == ["PLAIN HS256", "PLAIN RS256", "OAUTHBEARER JWKS"]
    for row in results["rows"].values():
        assert row["limit"]["signature_checks_per_s"] > 0
        for tokens in ("distinct", "same"):
            assert all(trial["errors"] == 0 and trial["logins"] == 200
                       for trial in row[tokens]["trials"])
    stormy = results["storm"]["storm"]["trials"]
    assert all(trial["storm"]["errors"] == 0 and trial["storm"]["logins"] > 0
               for trial in stormy)
    assert "login storm" in (tmp_path / "logins.md").read_text().lower()
