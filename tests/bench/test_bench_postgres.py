"""Smoke test of the benchmark's PostgreSQL rows (``python -m bench --postgres-only``) at
small counts: the C client reads every partition of the rows' topic, on postgres:// and
on memory://, and its row decides the consume target; without a C client the Python
consumer's row does, and the output says so. No timing assertions."""

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
    results = json.loads((out / "latest.json").read_text(encoding="utf-8"))
    postgres: dict[str, Any] = results["postgres"]
    return run.stdout, postgres


def _c_client() -> str:
    """The rdkafka_performance binary (built like the smoke test builds it), or a skip."""
    from bench.cclient import BuildError, rdkafka_performance

    try:
        return str(rdkafka_performance())
    except (BuildError, OSError) as exc:
        pytest.skip(f"no C client here: {exc}")


@pytest.mark.timeout(300)
def test_the_c_client_reads_every_partition_and_decides_consume(tmp_path: Path) -> None:
    _c_client()
    stdout, postgres = _run(tmp_path)
    assert postgres["c_client"] is True
    assert postgres["consume_decided_by"] == "consume_c"
    trial = postgres["trials"][0]
    for side in ("broker", "memory"):
        consumed = trial[side]["consume_c"]
        assert consumed["records"] == RECORDS  # all partitions, not partition 0 alone
        assert consumed["records_per_s"] > 0
        assert postgres[side]["consume_c"] > 0
    assert postgres["consume_ratio"] > 0
    assert postgres["consume_python_ratio"] > 0
    assert "consume (C client, all partitions)" in stdout
    assert "(decides consume)" in stdout
    assert "(C client; Python consumer " in stdout


@pytest.mark.timeout(300)
def test_without_a_c_client_the_python_consumer_decides_and_says_so(tmp_path: Path) -> None:
    stdout, postgres = _run(tmp_path, "--no-c-client")
    assert postgres["c_client"] is False
    assert postgres["consume_decided_by"] == "consume"
    assert "consume_c" not in postgres["broker"]
    assert postgres["consume_ratio"] == postgres["consume_python_ratio"]
    assert "No C client (rdkafka_performance) here" in stdout
    assert "(Python consumer: no C client;" in stdout
