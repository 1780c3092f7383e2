"""The whole benchmark: both brokers up at once (idle one costs nothing), trials
interleaved between them so that noise from the rest of the machine hits both alike,
each throughput figure the median of ``--repeat`` trials and each latency figure of
``--latency-repeat`` (the trial with the median p99); then the
many-partitions scenario on a fresh process of each broker.
"""

from __future__ import annotations

import sys
from typing import Any

from bench.brokers import Broker, make_broker
from bench.cclient import find_or_build
from bench.options import Options
from bench.pinning import CpuPlan
from bench.runner import MB, Bench, latency, many_partitions, throughput


def _say(what: str) -> None:
    print(f"[bench] {what}", file=sys.stderr, flush=True)


def median_by(trials: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The trial whose ``key`` is the median (the lower one of an even count)."""
    ordered = sorted(trials, key=lambda trial: float(trial[key]))
    return ordered[(len(ordered) - 1) // 2]


def _median_throughput(trials: list[dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {"size": trials[0]["size"], "records": trials[0]["records"]}
    for phase in ("produce", "consume", "consume_wide", "produce_c", "consume_c"):
        if phase not in trials[0]:
            continue
        runs = [trial[phase] for trial in trials]
        row[phase] = {**median_by(runs, "records_per_s"),
                      "trials_records_per_s": [run["records_per_s"] for run in runs],
                      "trials_broker_cpu_s": [run["broker_cpu_s"] for run in runs]}
    return row


def _median_latency(trials: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("p50_ms", "p99_ms", "p999_ms")
    return {**median_by(trials, "p99_ms"),
            "trials": [{key: trial[key] for key in keys} for trial in trials]}


def _order(names: list[str], trial: int) -> list[str]:
    return names if trial % 2 == 0 else names[::-1]


def _throughputs(benches: dict[str, Bench], brokers: dict[str, Broker], opts: Options,
                 results: dict[str, dict[str, Any]]) -> None:
    for size in opts.sizes:
        trials: dict[str, list[dict[str, Any]]] = {name: [] for name in brokers}
        for trial in range(opts.repeat):
            for name in _order(list(brokers), trial):
                _say(f"{name}: throughput {size} B x {opts.records_for(size):,}, "
                     f"trial {trial + 1}/{opts.repeat}")
                trials[name].append(throughput(benches[name], brokers[name], size, trial))
        for name, runs in trials.items():
            results[name]["throughput"].append(_median_throughput(runs))


def _latencies(benches: dict[str, Bench], brokers: dict[str, Broker], opts: Options,
               results: dict[str, dict[str, Any]], linger_ms: float) -> dict[str, Any]:
    trials: dict[str, list[dict[str, Any]]] = {name: [] for name in brokers}
    for trial in range(opts.latency_repeat):
        for name in _order(list(brokers), trial):
            _say(f"{name}: latency at {opts.rate:,.0f}/s, linger.ms={linger_ms:g}, "
                 f"trial {trial + 1}/{opts.latency_repeat}")
            trials[name].append(latency(benches[name], brokers[name], trial, linger_ms))
    return {name: _median_latency(runs) for name, runs in trials.items()}


def run_suite(opts: Options, cpus: CpuPlan) -> dict[str, dict[str, Any]]:
    """Every scenario on every broker in ``opts.brokers``; results by broker name."""
    c_client = find_or_build() if opts.c_client else None
    benches = {name: Bench(opts, cpus, c_client=c_client) for name in opts.brokers}
    brokers = {name: make_broker(name) for name in opts.brokers}
    results: dict[str, dict[str, Any]] = {
        name: {"name": name, "label": broker.label, "version": broker.version(),
               "throughput": []}
        for name, broker in brokers.items()}
    started: list[Broker] = []
    try:
        for name, broker in brokers.items():
            _say(f"{name}: starting {results[name]['version']}")
            broker.start(cpus.broker)
            started.append(broker)
        cpu0 = {name: broker.cpu_seconds() for name, broker in brokers.items()}
        _throughputs(benches, brokers, opts, results)
        # The benchmark's linger first (the targets use it), then the extra ones.
        for linger in [opts.linger_ms, *opts.extra_latency_lingers]:
            medians = _latencies(benches, brokers, opts, results, linger)
            for name, median in medians.items():
                if linger == opts.linger_ms:
                    results[name]["latency"] = median
                else:
                    results[name].setdefault("latency_extra", []).append(median)
        for name, broker in brokers.items():
            results[name]["cpu_seconds_total"] = broker.cpu_seconds() - cpu0[name]
            results[name]["peak_rss_mb"] = broker.peak_rss_bytes() / MB
    finally:
        for broker in started:
            broker.stop()
    for name, bench in benches.items():
        _say(f"{name}: {opts.partitions_scenario:,} partitions")
        results[name]["partitions"] = many_partitions(bench, name)
        results[name]["noise"] = bench.noise.as_json()
    return results
