"""The cluster throughput rows: 1, 2 and 3 brokers on one PostgreSQL (a database each),
the same records spread over the same number of partitions, produced then consumed by the
same load generators as the single-broker rows. Trials alternate between the cluster
sizes, as the main rows alternate between brokers; a cluster's CPU is the sum of its
brokers' CPU seconds, and PostgreSQL's CPU is read beside it.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from bench.admin import create_topic, delete_topic
from bench.cluster import BrokerGroup
from bench.cluster_db import postgres_cpu_seconds
from bench.options import Options
from bench.pinning import CpuPlan
from bench.report import median
from bench.runner import Bench, LoadError, _summary, run_worker
from bench.suite import median_by

if TYPE_CHECKING:
    from tests.postgres_server import PostgresServer

MILLION = 1_000_000


def _say(what: str) -> None:
    print(f"[bench] {what}", file=sys.stderr, flush=True)


def _trial(bench: Bench, group: BrokerGroup, server: PostgresServer,
           trial: int) -> dict[str, Any]:
    """Produce the records over the partitions, read them all back; CPU of both sides."""
    opts = bench.opts.cluster
    topic = f"bench-cluster-{trial}"
    create_topic(group.bootstrap, topic, opts.partitions)
    group.wait_settled(topic)
    try:
        pg0 = postgres_cpu_seconds(server)
        produced = run_worker(bench, group, "produce", topic, size=opts.size,
                              count=opts.records, partitions=opts.partitions)
        consumed = run_worker(bench, group, "consume", topic, count=opts.records)
        pg_cpu = postgres_cpu_seconds(server) - pg0
    finally:
        delete_topic(group.bootstrap, topic)
    for phase, done in (("produced", produced), ("consumed", consumed)):
        if done.load["records"] != opts.records:
            raise LoadError(f"{group.name}: {phase} {done.load['records']} of {opts.records}")
    broker_cpu = produced.broker_cpu_s + consumed.broker_cpu_s
    return {"produce": _summary(produced), "consume": _summary(consumed),
            "broker_cpu_s": broker_cpu, "postgres_cpu_s": pg_cpu,
            "broker_cpu_s_per_million": broker_cpu * MILLION / opts.records,
            "postgres_cpu_s_per_million": pg_cpu * MILLION / opts.records}


def _median_row(brokers: int, trials: list[dict[str, Any]],
                single: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The median trial of each phase and of the CPU; the CPU ratio to one broker is the
    median of trial-by-trial ratios (trial *i* of both ran back to back)."""
    row: dict[str, Any] = {"brokers": brokers, "trials": trials}
    for phase in ("produce", "consume"):
        runs = [trial[phase] for trial in trials]
        row[phase] = {**median_by(runs, "records_per_s"),
                      "trials_records_per_s": [run["records_per_s"] for run in runs]}
    for key in ("broker_cpu_s_per_million", "postgres_cpu_s_per_million"):
        row[key] = median([float(trial[key]) for trial in trials])
    if single is not None:
        ratios = [ours["broker_cpu_s_per_million"] / theirs["broker_cpu_s_per_million"]
                  for ours, theirs in zip(trials, single, strict=False)
                  if theirs["broker_cpu_s_per_million"] > 0]
        row["cpu_ratio_to_one"] = median(ratios) if ratios else None
        row["cpu_ratios_to_one"] = ratios
    return row


def idle_cpu(groups: list[BrokerGroup], seconds: float) -> list[float]:
    """Each group's CPU seconds per second with no client: heartbeats, lease renewals,
    reconciling ownership and following the other brokers' changes."""
    before = [group.cpu_seconds() for group in groups]
    time.sleep(seconds)
    return [(group.cpu_seconds() - cpu0) / seconds for group, cpu0 in zip(groups, before,
                                                                          strict=True)]


def cluster_throughput(opts: Options, cpus: CpuPlan, server: PostgresServer) -> dict[str, Any]:
    """Every cluster size of ``opts.cluster.sizes`` up at once (a database each), the
    trials interleaved; one row per size."""
    sizes = opts.cluster.sizes
    groups = {n: BrokerGroup(server.new_database_url(), n) for n in sizes}
    benches = {n: Bench(opts, cpus) for n in sizes}
    trials: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    try:
        for group in groups.values():
            _say(f"cluster: starting {group.name} on PostgreSQL")
            group.start(cpus.broker)
        _say(f"cluster: {opts.cluster.idle_seconds:g} s idle")
        idle = idle_cpu(list(groups.values()), opts.cluster.idle_seconds)
        for trial in range(opts.cluster.repeat):
            for n in (sizes if trial % 2 == 0 else sizes[::-1]):
                _say(f"cluster: {groups[n].name}, {opts.cluster.records:,} records over "
                     f"{opts.cluster.partitions} partitions, trial {trial + 1}/"
                     f"{opts.cluster.repeat}")
                trials[n].append(_trial(benches[n], groups[n], server, trial))
    finally:
        for group in groups.values():
            group.stop()
    single = trials.get(1)
    rows = [_median_row(n, trials[n], single) for n in sizes]
    for row, idle_cpu_s in zip(rows, idle, strict=True):
        row["idle_cpu_pct"] = 100.0 * idle_cpu_s
    return {"rows": rows,
            "noise": {str(n): benches[n].noise.as_json() for n in sizes}}
