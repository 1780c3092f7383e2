"""Smoke test of the benchmark harness: ``python -m bench --quick`` end to end against this
broker and Tansu, checking the table, the JSON and the chart (no timing assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.broker_process import REPO

SIZES = [100, 1024, 16384]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """One quick run into a temporary results folder: (stdout, folder)."""
    out = tmp_path_factory.mktemp("bench-results")
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--no-cluster", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=560, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout, out


@pytest.mark.timeout(600)
def test_quick_run_prints_a_table_with_both_brokers(quick_run: tuple[str, Path]) -> None:
    stdout, out = quick_run
    assert "| metric | this broker | Tansu | this / Tansu |" in stdout
    for label in ("produce 100 B", "consume 1 KiB", "produce 16 KiB", "latency p99",
                  "peak RSS MB, 20 partitions", "produce 100 B, C client",
                  "consume 16 KiB, C client", "consume 1 KiB, max.partition.fetch.bytes"):
        assert label in stdout
    rows = [line for line in stdout.splitlines() if line.startswith("| ")]
    assert all(line.count("|") == 5 for line in rows)
    assert "| metric | this broker, postgres:// | raw psycopg 3 | broker / raw |" in stdout
    # 6 + postgres; the CPU of a quick run may be too small to read (not measured)
    assert sum(stdout.count(f"**{mark}**") for mark in ("met", "NOT met", "not measured")) == 7
    # the PostgreSQL rows have files of their own (postgres.md), after the main ones
    assert stdout.strip() == "\n\n".join(
        (out / name).read_text(encoding="utf-8").strip() for name in ("latest.md", "postgres.md"))


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and value > 0


@pytest.mark.timeout(600)
def test_quick_run_writes_well_formed_json(quick_run: tuple[str, Path]) -> None:
    _, out = quick_run
    results = json.loads((out / "latest.json").read_text(encoding="utf-8"))
    assert results["options"]["sizes"] == SIZES
    assert set(results["brokers"]) == {"edge", "tansu"}
    for broker in results["brokers"].values():
        assert [row["size"] for row in broker["throughput"]] == SIZES
        for row in broker["throughput"]:
            for phase in ("produce", "consume", "consume_wide", "produce_c", "consume_c"):
                expected = row["records"] * (2 if phase.endswith("_c") else 1)
                assert row[phase]["records"] == expected
                assert row[phase]["errors"] == 0
                assert _positive(row[phase]["records_per_s"])
                assert _positive(row[phase]["mb_per_s"])
        latency = broker["latency"]
        assert latency["measured"] > 0
        assert 0 < latency["p50_ms"] <= latency["p99_ms"] <= latency["p999_ms"]
        assert _positive(broker["peak_rss_mb"])
        assert broker["partitions"]["partitions"] == 20
        assert _positive(broker["partitions"]["peak_rss_mb"])
    assert [t["met"] in (True, False, None) for t in results["targets"]] == [True] * 6
    # the broker's own produce timings, from its metrics (Tansu serves none)
    handled = results["brokers"]["edge"]["latency"]
    assert handled["handled_requests"] > 0
    assert 0 <= handled["handled_within_target"] <= 1
    assert "handled_requests" not in results["brokers"]["tansu"]["latency"]
    rows = json.loads((out / "postgres.json").read_text(encoding="utf-8"))
    assert [t["met"] in (True, False, None) for t in rows["targets"]] == [True]
    postgres = rows["postgres"]
    assert postgres["consume_decided_by"] == "consume_c"  # the C client rows run above too
    for side, phases in (("broker", ("produce", "consume", "consume_c")),
                         ("memory", ("produce", "consume", "consume_c")),
                         ("raw", ("produce", "produce_one", "consume", "consume_bulk"))):
        for phase in phases:
            assert _positive(postgres[side][phase])


@pytest.mark.timeout(600)
def test_the_c_client_reads_every_postgres_partition_and_decides_consume(
        quick_run: tuple[str, Path]) -> None:
    """The PostgreSQL rows of the quick run (``bench/postgres.py``; their run without a C
    client is tests/bench/test_bench_postgres.py): the C client reads every partition of
    the rows' topic, on postgres:// and on memory://, and its row decides consume."""
    stdout, out = quick_run
    postgres = json.loads((out / "postgres.json").read_text(encoding="utf-8"))["postgres"]
    assert postgres["c_client"] is True
    assert postgres["consume_decided_by"] == "consume_c"
    assert postgres["partitions"] > 1
    trial = postgres["trials"][0]
    for side in ("broker", "memory"):
        consumed = trial[side]["consume_c"]
        assert consumed["records"] == postgres["records"]  # all partitions, not the first
        assert consumed["records_per_s"] > 0
        assert postgres[side]["consume_c"] > 0
    assert postgres["consume_ratio"] > 0
    assert postgres["consume_python_ratio"] > 0
    assert "consume (C client, all partitions)" in stdout
    assert "(decides consume)" in stdout
    assert "(C client; Python consumer " in stdout


@pytest.mark.timeout(600)
def test_quick_run_draws_a_small_png(quick_run: tuple[str, Path]) -> None:
    _, out = quick_run
    png = (out / "latest.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(png) < 200_000
    assert len((out / "latest.json").read_bytes()) < 50_000


def test_the_c_client_tarball_is_checked_against_its_pinned_digest() -> None:
    from bench.cclient import BuildError, _check_integrity

    with pytest.raises(BuildError, match="not the pinned one"):
        _check_integrity(b"not the node-rdkafka tarball")
