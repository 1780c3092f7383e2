"""The benchmark report's arithmetic: throughput ratios paired trial by trial, and the
targets judged on them (no broker, no timing)."""

from __future__ import annotations

from typing import Any

from bench import report, verdicts


def _phase(trials: list[float], client_bound: bool = False,
           cpu: list[float] | None = None) -> dict[str, Any]:
    middle = report.median(trials)
    return {"records": 10, "records_per_s": middle, "mb_per_s": middle / 1e6,
            "broker_cpu_s": 1.0, "client_bound": client_bound,
            "trials_records_per_s": trials, "trials_broker_cpu_s": cpu or [1.0] * len(trials)}


def _results(ours: list[float], peer: list[float], bound: bool = False,
             cpu: tuple[list[float], list[float]] | None = None) -> dict[str, Any]:
    def broker(trials: list[float], spent: list[float] | None) -> dict[str, Any]:
        phase = _phase(trials, bound, spent)
        return {"throughput": [{"size": 100, "records": 10, "produce": phase,
                                "consume": phase, "produce_c": phase, "consume_c": phase}]}
    spent = cpu or (None, None)
    return {"brokers": {"edge": broker(ours, spent[0]), "tansu": broker(peer, spent[1])},
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
    [check, _] = [c for c in verdicts.targets(_with_latency(results))
                  if c["target"].startswith(("produce throughput", "consume throughput"))]
    assert check["met"] is True
    assert check["detail"] == "100 B 1.050x"


def test_where_both_clients_were_saturated_the_broker_cpu_decides() -> None:
    # slower in every pair, but both load generators were saturated: the broker's CPU per
    # record (paired trial by trial) decides, against half of Tansu's
    cheap = _results([90.0, 95.0, 99.0], [100.0, 100.0, 100.0], bound=True,
                     cpu=([0.4, 0.5, 0.6], [1.0, 1.0, 1.0]))
    produce = verdicts.targets(_with_latency(cheap))[0]
    assert produce["met"] is True
    assert produce["detail"] == "100 B CPU 0.500x (both client-bound)"
    costly = _results([90.0, 95.0, 99.0], [100.0, 100.0, 100.0], bound=True,
                      cpu=([0.6, 0.5, 0.6], [1.0, 1.0, 1.0]))
    assert verdicts.targets(_with_latency(costly))[0]["met"] is False


def test_the_cpu_target_holds_at_every_size_for_produce_and_consume() -> None:
    results = _with_latency(_results([100.0], [100.0], cpu=([0.45], [1.0])))
    [cpu] = [c for c in verdicts.targets(results) if c["target"].startswith("broker CPU")]
    assert cpu["met"] is True
    assert cpu["detail"] == "100 B 0.45x / 0.45x"
    results["brokers"]["edge"]["throughput"][0]["consume_c"] = _phase([100.0], cpu=[0.7])
    [cpu] = [c for c in verdicts.targets(results) if c["target"].startswith("broker CPU")]
    assert cpu["met"] is False


def test_latency_is_judged_at_linger_1_paired_trial_by_trial() -> None:
    results = _with_latency(_results([100.0], [100.0]))
    results["options"] |= {"linger_ms": 5.0, "extra_latency_lingers": [1.0]}
    edge, tansu = results["brokers"]["edge"], results["brokers"]["tansu"]
    # one noisy trial of this broker: two pairs out of three are at or below Tansu's
    edge["latency_extra"] = [{"p99_ms": 2.0, "trials": [
        {"p99_ms": 2.0}, {"p99_ms": 40.0}, {"p99_ms": 1.9}], "handled_requests": 1000.0,
        "handled_within_target": 0.995, "handled_p99_bound_ms": 1.0}]
    tansu["latency_extra"] = [{"p99_ms": 2.0, "trials": [
        {"p99_ms": 2.1}, {"p99_ms": 2.0}, {"p99_ms": 2.0}]}]
    delivery, handling = (c for c in verdicts.targets(results)
                          if "linger.ms=1" in c["target"])
    assert delivery["met"] is True
    assert handling["met"] is True
    assert handling["detail"].startswith("99.50% of 1,000 requests within 1 ms")
    edge["latency_extra"][0]["handled_within_target"] = 0.98
    handling = next(c for c in verdicts.targets(results) if "handling" in c["target"])
    assert handling["met"] is False


def test_latency_without_a_linger_1_run_is_not_measured() -> None:
    results = _with_latency(_results([100.0], [100.0]))
    results["options"] |= {"linger_ms": 5.0, "extra_latency_lingers": []}
    checks = [c for c in verdicts.targets(results) if "linger.ms=1" in c["target"]]
    assert [c["met"] for c in checks] == [None, None]


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
