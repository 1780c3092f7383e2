"""Smoke test of ``python -m bench.recompress --quick``: it runs end to end against this
broker and prints its table (no timing assertions)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.broker_process import REPO


@pytest.mark.timeout(300)
def test_quick_run_prints_both_topics_and_the_ratio() -> None:
    run = subprocess.run([sys.executable, "-m", "bench.recompress", "--quick", "--no-pin"],
                         cwd=REPO, capture_output=True, text=True, timeout=280, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith("| ")]
    assert rows[0] == "| topic compression.type | records/s | broker CPU s per million records |"
    assert [row.split("|")[1].strip() for row in rows[1:]] == [
        "producer", "zstd", "zstd / producer"]
    assert all(row.count("|") == 4 for row in rows)
