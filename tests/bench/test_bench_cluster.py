"""Smoke test of the cluster rows of the benchmark: ``python -m bench.cluster_suite
--quick`` end to end (1 and 3 brokers on a throwaway PostgreSQL, one kill -9 per
membership setting), checking the tables and the JSON (no timing assertions); and the
arithmetic of the cluster targets on given numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import cluster_report
from tests.broker_process import REPO


@pytest.fixture(scope="module")
def quick_cluster_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """One quick run of the cluster rows into a temporary results folder: (stdout, folder)."""
    out = tmp_path_factory.mktemp("bench-cluster")
    run = subprocess.run(
        [sys.executable, "-m", "bench.cluster_suite", "--quick", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=560, check=False)
    assert run.returncode == 0, run.stdout + run.stderr[-5000:]
    return run.stdout, out


@pytest.mark.timeout(600)
def test_quick_cluster_run_prints_both_tables_and_two_targets(
        quick_cluster_run: tuple[str, Path]) -> None:
    stdout, out = quick_cluster_run
    assert "| metric | 1 broker | 3 brokers | 3 separate brokers (no cluster) |" in stdout
    for label in ("produce: records/s", "consume: records/s",
                  "brokers' CPU s per million records", "against one broker", "while idle",
                  "PostgreSQL CPU s per million records",
                  "| defaults (brokerSessionTimeoutMs=6000, brokerHeartbeatIntervalMs=1000) | 1 |",
                  "new leader in Metadata",
                  "| brokerSessionTimeoutMs=2000, brokerHeartbeatIntervalMs=250 | 1 |"):
        assert label in stdout
    assert "**librdkafka's own batches**" in stdout and "**equal batches" in stdout
    assert stdout.count("**met**") + stdout.count("**NOT met**") == 3  # none for the control
    assert stdout.count("3 separate brokers sharing the brokers' CPU spend ") == 2
    assert stdout.count("; the cluster of 3 spends ") == 2
    assert (out / "cluster.md").read_text(encoding="utf-8").strip() == stdout.strip()


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and value > 0


@pytest.mark.timeout(600)
def test_quick_cluster_run_writes_every_figure(quick_cluster_run: tuple[str, Path]) -> None:
    _, out = quick_cluster_run
    results = json.loads((out / "cluster.json").read_text(encoding="utf-8"))
    records = results["options"]["records"]
    batchings = results["throughput"]["batchings"]
    assert [b["name"] for b in batchings] == ["client", "equal"]
    rows = [row for batching in batchings for row in batching["rows"]]
    assert [row["brokers"] for row in rows] == [1, 3, 3, 1, 3, 3]
    assert [bool(row.get("separate")) for row in rows] == [False, False, True] * 2
    for row in rows:
        for phase in ("produce", "consume"):  # the separate brokers: a third each
            assert row[phase]["records"] == (records // 3 * 3 if row.get("separate")
                                             else records)
            assert row[phase]["errors"] == 0
            assert _positive(row[phase]["records_per_s"])
        assert _positive(row["broker_cpu_s_per_million"])
        assert row["idle_cpu_pct"] >= 0
        assert row["postgres_cpu_s_per_million"] >= 0
        assert _positive(row["cpu_ratio_to_one"])
        assert _positive(row["batches_per_thousand"])
        assert _positive(row["commits_per_thousand"])
    assert rows[0]["cpu_ratio_to_one"] == rows[3]["cpu_ratio_to_one"] == 1.0
    assert set(results["throughput"]["noise"]) == {"1", "3", "separate"}
    default, fast = results["failover"]
    assert default["settings"] == {}
    assert fast["settings"] == {"brokerSessionTimeoutMs": "2000",
                                "brokerHeartbeatIntervalMs": "250"}
    for run in (default, fast):
        [kill] = run["rounds"]
        assert kill["partitions"], "the killed broker owned no partition"
        assert 0 < kill["first_ack_s"] <= kill["all_acked_s"]
        assert kill["leader_moved_s"] > 0
        assert run["first_ack_max_s"] == kill["first_ack_s"]
    assert [t["met"] in (True, False) for t in results["targets"]] == [True, True, True]


def _cluster(ratios: list[float], first_acks: list[float]) -> dict[str, Any]:
    rows = [{"brokers": 1, "cpu_ratio_to_one": 1.0},
            *({"brokers": n + 2, "cpu_ratio_to_one": r} for n, r in enumerate(ratios))]
    failover = {"settings": {}, "kills": len(first_acks),
                "first_ack_p50_s": sorted(first_acks)[(len(first_acks) - 1) // 2],
                "first_ack_max_s": max(first_acks)}
    fast = {**failover, "settings": {"brokerSessionTimeoutMs": "2000"}}
    return {"throughput": {"batchings": [{"name": "equal", "label": "equal batches",
                                          "rows": rows}]},
            "failover": [failover, fast]}


def test_the_cpu_target_holds_for_every_cluster_size_or_none() -> None:
    [cpu, _] = cluster_report.targets(_cluster([1.04, 1.09], [7.0]))
    assert cpu["met"] is True
    assert cpu["detail"] == "2 brokers 1.040x, 3 brokers 1.090x"
    [cpu, _] = cluster_report.targets(_cluster([1.04, 1.2], [7.0]))
    assert cpu["met"] is False


def test_the_failover_target_is_judged_on_the_worst_kill_with_default_settings() -> None:
    [_, failover] = cluster_report.targets(_cluster([1.0], [6.5, 7.0, 11.0]))
    assert failover["met"] is False
    assert failover["detail"] == "p50 7.00 s, max 11.00 s"
    [_, failover] = cluster_report.targets(_cluster([1.0], [6.5, 7.0, 9.9]))
    assert failover["met"] is True


def test_the_separate_brokers_split_the_cost_into_sharing_and_the_cluster_own() -> None:
    rows = [{"brokers": 1, "cpu_ratio_to_one": 1.0, "broker_cpu_s_per_million": 4.0},
            {"brokers": 3, "cpu_ratio_to_one": 1.2, "broker_cpu_s_per_million": 4.8},
            {"brokers": 3, "cpu_ratio_to_one": 1.1, "broker_cpu_s_per_million": 4.4,
             "separate": True}]
    cluster = {"throughput": {"batchings": [{"name": "equal", "label": "equal batches",
                                             "rows": rows}]}, "failover": []}
    assert cluster_report.sharing_text(cluster) == (
        "- equal batches: 3 separate brokers sharing the brokers' CPU spend 1.10x one lone "
        "broker's CPU per record, with no cluster; the cluster of 3 spends 1.09x theirs "
        "(its own cost)")
    [cpu] = cluster_report.targets(cluster)  # the control is no cluster: not judged
    assert cpu["detail"] == "3 brokers 1.200x"
