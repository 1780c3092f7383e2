"""Smoke test of the benchmark's PostgreSQL rows (``python -m bench --postgres-only``) at
small counts: without a C client the Python consumer's row decides the consume target,
and the output says so. No timing assertions. (With the C client, which reads every
partition and decides consume, the rows are checked on the quick run of
tests/bench/test_bench_smoke.py, which runs them too.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.broker_process import REPO

pytestmark = pytest.mark.long_running(minutes=2)


RECORDS = 2_000
PARTITIONS = 3


def _run(out: Path, *extra: str) -> tuple[str, dict[str, Any]]:
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--postgres-only", "--quick", "--repeat", "1",
         "--postgres-records", str(RECORDS), "--postgres-partitions", str(PARTITIONS),
         "--out", str(out), *extra],
        cwd=REPO, capture_output=True, text=True, timeout=280, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert not (out / "latest.json").exists()  # the main rows' files are not touched
    results = json.loads((out / "postgres.json").read_text(encoding="utf-8"))
    postgres: dict[str, Any] = results["postgres"]
    return run.stdout, postgres


@pytest.mark.timeout(300)
def test_without_a_c_client_the_python_consumer_decides_and_says_so(tmp_path: Path) -> None:
    stdout, postgres = _run(tmp_path, "--no-c-client")
    assert postgres["c_client"] is False
    assert postgres["consume_decided_by"] == "consume"
    assert "consume_c" not in postgres["broker"]
    assert postgres["consume_ratio"] == postgres["consume_python_ratio"]
    assert "No C client (rdkafka_performance) here" in stdout
    assert "(Python consumer: no C client;" in stdout
