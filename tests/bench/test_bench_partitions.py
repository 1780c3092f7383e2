"""Smoke test of ``python -m bench.partitions --quick``: the partitions row runs end to end
against this broker (20 topics x 5), with librdkafka and the Java client, and writes its
table and JSON (no timing assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(400)
def test_quick_run_writes_the_row(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "bench.partitions", "--quick", "--out",
                          str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         timeout=380, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "### 100 partitions" in run.stdout
    result = json.loads((tmp_path / "partitions.json").read_text())
    assert result["partitions"] == 100
    trials = [result[kind] for kind in ("single", "many", "java_single", "java_many")]
    assert all(len(kind) == 1 for kind in trials)
    assert all(trial["errors"] == 0 and trial["records"] == 4000
               for kind in trials for trial in kind)
    assert result["creation"]["answered_meanwhile"] >= 1
    assert result["clean_stop_s"] > 0
    assert set(result["targets"]) == {"ratio", "java_ratio", "rss", "start"}
    assert "Java kafka-clients" in run.stdout
    assert (tmp_path / "partitions.md").read_text().startswith("### 100 partitions")
