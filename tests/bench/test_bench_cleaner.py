"""Smoke test of ``python -m bench.cleaner --quick``: it fills a topic, switches it to
``compact``, waits for the cleaner and prints its table (no timing assertions)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(400)
def test_quick_run_prints_the_cleaner_row() -> None:
    run = subprocess.run([sys.executable, "-m", "bench.cleaner", "--quick", "--no-pin"],
                         cwd=REPO, capture_output=True, text=True, timeout=380, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| logCleanerIoMaxBytesPerSecond | log before → after (MB) "
                              "| cleaner MB/s |")
    assert len(rows) == 2 and rows[1].startswith("| 50 MiB/s | ")
    cells = [cell.strip() for cell in rows[1].strip("|").split("|")]
    before, after = (float(x.replace(",", "")) for x in cells[1].split(" → "))
    assert after < before  # the cleaner kept one record per key
