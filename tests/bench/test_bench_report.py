"""The benchmark report's arithmetic: throughput ratios paired trial by trial, and the
targets judged on them (no broker, no timing)."""

from __future__ import annotations

from typing import Any

from bench import report


def _phase(trials: list[float], client_bound: bool = False) -> dict[str, Any]:
    middle = report.median(trials)
    return {"records_per_s": middle, "mb_per_s": middle / 1e6, "broker_cpu_s": 1.0,
            "client_bound": client_bound, "trials_records_per_s": trials}


def _results(ours: list[float], peer: list[float], bound: bool = False) -> dict[str, Any]:
    def broker(trials: list[float]) -> dict[str, Any]:
        phase = _phase(trials, bound)
        return {"throughput": [{"size": 100, "records": 10, "produce": phase,
                                "consume": phase}]}
    return {"brokers": {"edge": broker(ours), "tansu": broker(peer)},
            "options": {"sizes": [100]}}


def test_median_of_odd_and_even_counts() -> None:
    assert report.median([3.0, 1.0, 2.0]) == 2.0
    assert report.median([4.0, 1.0, 3.0, 2.0]) == 2.5


def test_ratios_pair_each_trial_with_the_peer_trial_beside_it() -> None:
    ours, peer = _phase([100.0, 50.0, 90.0]), _phase([50.0, 100.0, 100.0])
    assert report.paired_ratios(ours, peer) == [2.0, 0.5, 0.9]


def test_a_noisy_trial_moves_the_pair_not_the_verdict() -> None:
    # A slow minute hit this broker's first trial and both fourth ones: the medians of each
    # side say 0.78x, while this broker was ahead in three pairs out of four.
    results = _results([50.0, 105.0, 105.0, 50.0], [100.0, 100.0, 100.0, 45.0])
    [check, _] = [c for c in report.targets(_with_latency(results))
                  if c["target"].startswith(("produce throughput", "consume throughput"))]
    assert check["met"] is True
    assert check["detail"] == "100 B 1.050x"


def test_targets_say_when_both_brokers_were_client_bound() -> None:
    results = _with_latency(_results([90.0, 95.0, 99.0], [100.0, 100.0, 100.0], bound=True))
    produce = report.targets(results)[0]
    assert produce["met"] is False
    assert produce["detail"] == "100 B 0.950x (c: both client-bound)"


def test_the_table_shows_the_paired_median_and_its_range() -> None:
    rows = report.rows(_with_latency(_results([100.0, 50.0, 90.0], [50.0, 100.0, 100.0])))
    produce = next(row for row in rows if row[0].startswith("produce 100 B"))
    assert produce[3] == "0.90x (0.50-2.00)"


def _with_latency(results: dict[str, Any]) -> dict[str, Any]:
    results["options"] |= {"rate": 20000.0, "latency_size": 1024, "partitions_scenario": 10}
    for broker in results["brokers"].values():
        broker["latency"] = {"p50_ms": 1.0, "p99_ms": 2.0, "p999_ms": 3.0,
                             "rtt_p50_ms": 0.5, "rtt_p99_ms": 1.0, "achieved_rate": 20000.0}
        broker["partitions"] = {"peak_rss_mb": 50.0}
        broker["cpu_seconds_total"] = 1.0
        broker["peak_rss_mb"] = 50.0
        broker["noise"] = {"others_share_pct": 1.0, "load_others_share_pct": 1.0}
    return results
