"""Smoke test of ``python -m bench.tls --quick``: PLAINTEXT, SSL and SASL_SSL rows through
the OpenSSL build of rdkafka_performance, end to end against this broker (no timing
assertions). Skipped when that build cannot be had (no compiler or OpenSSL headers)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cclient import find_or_build

pytestmark = pytest.mark.long_running(minutes=3)


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
def test_quick_run_writes_every_listener_row(tmp_path: Path) -> None:
    if find_or_build() is None:
        pytest.skip("no TLS-capable rdkafka_performance")
    run = subprocess.run([sys.executable, "-m", "bench.tls", "--quick", "--no-pin",
                          "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         timeout=600, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    results = json.loads((tmp_path / "tls.json").read_text())
    assert sorted(results["rows"]) == sorted(f"{size} {protocol}" for size in (1024, 16384)
                                             for protocol in ("PLAINTEXT", "SSL", "SASL_SSL"))
    assert all(row["consume"]["mb_per_s"] > 0 for row in results["rows"].values())
    assert results["limit_aes_128_gcm_mb_per_s"]["16384"] > 0
    assert "TLS consume >= 50%" in (tmp_path / "tls.md").read_text()
