"""The cluster throughput rows: 1, 2 and 3 brokers on one PostgreSQL (a database each),
the same records spread over the same number of partitions, produced then consumed by the
same load generators as the single-broker rows. Trials alternate between the cluster
sizes, as the main rows alternate between brokers; a cluster's CPU is the sum of its
brokers' CPU seconds, and PostgreSQL's CPU is read beside it.

Each trial runs twice, once per :data:`BATCHINGS`: with the producer's batches as
librdkafka makes them, and with equal batches. librdkafka sends one partition's batch per
ProduceRequest and fills a batch only while it waits for its connection, so the same load
spread over three brokers arrives in about twice as many, smaller batches as on one; a
broker's CPU follows the number of requests as much as the number of records. Fixed-size
batches (``batch.size`` reached long before ``linger.ms``) and fetch responses of 12 MiB
(3 MiB per partition) make the requests the same whatever the cluster size, so that the
CPU difference is the brokers' own (their separate PostgreSQL commits, membership,
ownership checks).

Beside the largest cluster runs its control (:class:`SeparateBrokers`): as many single
brokers, each on a database of its own on the same server and pinned to the same CPUs,
each fed its share of the records over its share of the partitions by a load generator of
its own, all at once. They share nothing but the CPUs, so their CPU per record against
one lone broker is what running that many processes on these CPUs costs, without any
cluster; the cluster against them is what being a cluster costs on top.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg

from bench.admin import create_topic, delete_topic
from bench.cluster import HOME, BrokerGroup
from bench.cluster_db import postgres_cpu_seconds
from bench.options import Options
from bench.pinning import CpuPlan
from bench.report import median
from bench.runner import MB, Bench, LoadError, _summary, run_worker
from bench.suite import median_by
from broker_core.naming import to_internal

if TYPE_CHECKING:
    from tests.postgres_server import PostgresServer

MILLION = 1_000_000


@dataclass(frozen=True)
class Batching:
    """How the load generators batch: ``produce`` and ``consume`` are their extra options."""

    name: str
    label: str
    produce: dict[str, Any] = field(default_factory=dict)
    consume: dict[str, Any] = field(default_factory=dict)


EQUAL_BATCH_BYTES = 256 << 10
EQUAL_FETCH_BYTES = 12 << 20
"""A fetch response's cap: what one broker's 12 partitions give at the default 1 MiB per
partition; with a quarter of it per partition, each of three brokers' 4 partitions fill
it too."""
BATCHINGS = (
    Batching("client", "librdkafka's own batches"),
    Batching("equal", "equal batches (batch.size=256 KiB, linger.ms=1000; fetch.max.bytes="
                      "12 MiB, max.partition.fetch.bytes=3 MiB)",
             produce={"linger_ms": 1000, "config": [f"batch.size={EQUAL_BATCH_BYTES}"]},
             consume={"config": [f"fetch.max.bytes={EQUAL_FETCH_BYTES}",
                                 f"max.partition.fetch.bytes={EQUAL_FETCH_BYTES // 4}"]}),
)
"""The two ways each trial is run; the CPU target is read on the equal batches."""

_BATCHES = ("SELECT count(*) FROM edge_entries e JOIN edge_partitions p"
            " ON p.id = e.partition_id WHERE p.topic = %s")
_COMMITS = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"


def _say(what: str) -> None:
    print(f"[bench] {what}", file=sys.stderr, flush=True)


def _database(url: str, sql: str, *params: object) -> int:
    """One number from the cluster's database."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql, params).fetchone()
    return int(row[0]) if row else 0


def _trial(bench: Bench, group: BrokerGroup, server: PostgresServer, batching: Batching,
           trial: int) -> dict[str, Any]:
    """Produce the records over the partitions, read them all back; CPU of both sides,
    the batches stored and the database's commits while producing."""
    opts = bench.opts.cluster
    topic = f"bench-cluster-{batching.name}-{trial}"
    create_topic(group.bootstrap, topic, opts.partitions)
    group.wait_settled(topic)
    try:
        pg0 = postgres_cpu_seconds(server)
        commits0 = _database(group.url, _COMMITS)
        produced = run_worker(bench, group, "produce", topic, size=opts.size,
                              count=opts.records, partitions=opts.partitions,
                              **batching.produce)
        commits = _database(group.url, _COMMITS) - commits0
        batches = _database(group.url, _BATCHES, to_internal(topic, HOME))
        consumed = run_worker(bench, group, "consume", topic, count=opts.records,
                              **batching.consume)
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
            "postgres_cpu_s_per_million": pg_cpu * MILLION / opts.records,
            "batches_per_thousand": batches * 1000 / opts.records,
            "commits_per_thousand": commits * 1000 / opts.records}


class SeparateBrokers:
    """``count`` single brokers, each with a database of its own: the cluster's control."""

    def __init__(self, server: PostgresServer, count: int) -> None:
        self.groups = [BrokerGroup(server.new_database_url(), 1) for _ in range(count)]
        self.name = f"{count} separate brokers"

    def start(self, cpus: frozenset[int] | None) -> None:
        for group in self.groups:
            group.start(cpus)

    def stop(self) -> None:
        for group in self.groups:
            group.stop()

    def cpu_seconds(self) -> float:
        return sum(group.cpu_seconds() for group in self.groups)

    def trial(self, bench: Bench, server: PostgresServer, batching: Batching,
              trial: int) -> dict[str, Any]:
        """:func:`_trial` of each broker with its share, all at once; the figures of
        them all (throughput: all records over the longest run)."""
        opts = bench.opts.cluster
        count = len(self.groups)
        share = dataclasses.replace(opts, records=opts.records // count,
                                    partitions=max(opts.partitions // count, 1))
        each = dataclasses.replace(bench, opts=dataclasses.replace(bench.opts, cluster=share))
        with ThreadPoolExecutor(count) as pool:
            runs = list(pool.map(lambda group: _trial(each, group, server, batching, trial),
                                 self.groups))
        # each run read PostgreSQL's CPU during all of them: the longest run's reading
        pg_cpu = max(run["postgres_cpu_s"] for run in runs)
        records = share.records * count
        out: dict[str, Any] = {phase: _together([run[phase] for run in runs])
                               for phase in ("produce", "consume")}
        broker_cpu = sum(run["broker_cpu_s"] for run in runs)
        return {**out, "broker_cpu_s": broker_cpu, "postgres_cpu_s": pg_cpu,
                "broker_cpu_s_per_million": broker_cpu * MILLION / records,
                "postgres_cpu_s_per_million": pg_cpu * MILLION / records,
                "batches_per_thousand": sum(run["batches_per_thousand"] for run in runs)
                / count,
                "commits_per_thousand": sum(run["commits_per_thousand"] for run in runs)
                / count}


def _together(phases: list[dict[str, Any]]) -> dict[str, Any]:
    """Load generators' summaries of one phase run side by side, as one."""
    seconds = max(float(phase["seconds"]) for phase in phases)
    records = sum(int(phase["records"]) for phase in phases)
    size = sum(int(phase["bytes"]) for phase in phases)
    return {"records": records, "bytes": size, "seconds": seconds,
            "errors": sum(int(phase["errors"]) for phase in phases),
            "records_per_s": records / max(seconds, 1e-9),
            "mb_per_s": size / max(seconds, 1e-9) / MB,
            "broker_cpu_s": sum(float(phase["broker_cpu_s"]) for phase in phases),
            "client_bound": any(phase["client_bound"] for phase in phases)}


def _median_row(brokers: int, trials: list[dict[str, Any]],
                single: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The median trial of each phase and of the CPU; the CPU ratio to one broker is the
    median of trial-by-trial ratios (trial *i* of both ran back to back)."""
    row: dict[str, Any] = {"brokers": brokers, "trials": trials}
    for phase in ("produce", "consume"):
        runs = [trial[phase] for trial in trials]
        row[phase] = {**median_by(runs, "records_per_s"),
                      "trials_records_per_s": [run["records_per_s"] for run in runs]}
    for key in ("broker_cpu_s_per_million", "postgres_cpu_s_per_million",
                "batches_per_thousand", "commits_per_thousand"):
        row[key] = median([float(trial[key]) for trial in trials])
    if single is not None:
        ratios = [ours["broker_cpu_s_per_million"] / theirs["broker_cpu_s_per_million"]
                  for ours, theirs in zip(trials, single, strict=False)
                  if theirs["broker_cpu_s_per_million"] > 0]
        row["cpu_ratio_to_one"] = median(ratios) if ratios else None
        row["cpu_ratios_to_one"] = ratios
    return row


def idle_cpu(groups: list[BrokerGroup | SeparateBrokers], seconds: float) -> list[float]:
    """Each group's CPU seconds per second with no client: heartbeats, lease renewals,
    reconciling ownership and following the other brokers' changes."""
    before = [group.cpu_seconds() for group in groups]
    time.sleep(seconds)
    return [(group.cpu_seconds() - cpu0) / seconds for group, cpu0 in zip(groups, before,
                                                                          strict=True)]


def cluster_throughput(opts: Options, cpus: CpuPlan, server: PostgresServer) -> dict[str, Any]:
    """Every cluster size of ``opts.cluster.sizes`` up at once (a database each), the
    trials interleaved, each under both batchings; per batching, one row per size."""
    sizes = opts.cluster.sizes
    groups = {n: BrokerGroup(server.new_database_url(), n) for n in sizes}
    benches = {n: Bench(opts, cpus) for n in sizes}
    control = SeparateBrokers(server, max(sizes)) if max(sizes) > 1 else None
    control_bench = Bench(opts, cpus)
    trials: dict[tuple[str, int], list[dict[str, Any]]] = {
        (b.name, n): [] for b in BATCHINGS for n in sizes}
    separate: dict[str, list[dict[str, Any]]] = {b.name: [] for b in BATCHINGS}
    try:
        for group in groups.values():
            _say(f"cluster: starting {group.name} on PostgreSQL")
            group.start(cpus.broker)
        if control is not None:
            _say(f"cluster: starting {control.name} on PostgreSQL")
            control.start(cpus.broker)
        _say(f"cluster: {opts.cluster.idle_seconds:g} s idle")
        idle = idle_cpu([*groups.values(), *([control] if control else [])],
                        opts.cluster.idle_seconds)
        for trial in range(opts.cluster.repeat):
            for n in (sizes if trial % 2 == 0 else sizes[::-1]):
                for batching in BATCHINGS:
                    _say(f"cluster: {groups[n].name}, {opts.cluster.records:,} records over "
                         f"{opts.cluster.partitions} partitions, {batching.name} batches, "
                         f"trial {trial + 1}/{opts.cluster.repeat}")
                    trials[batching.name, n].append(
                        _trial(benches[n], groups[n], server, batching, trial))
                    if control is not None and n == max(sizes):
                        _say(f"cluster: {control.name}, their shares at once")
                        separate[batching.name].append(
                            control.trial(control_bench, server, batching, trial))
    finally:
        for group in groups.values():
            group.stop()
        if control is not None:
            control.stop()
    out: list[dict[str, Any]] = []
    for batching in BATCHINGS:
        single = trials.get((batching.name, 1))
        rows = [_median_row(n, trials[batching.name, n], single) for n in sizes]
        if control is not None:
            rows.append({**_median_row(len(control.groups), separate[batching.name], single),
                         "separate": True})
        for row, idle_cpu_s in zip(rows, idle, strict=True):
            row["idle_cpu_pct"] = 100.0 * idle_cpu_s
        out.append({"name": batching.name, "label": batching.label, "rows": rows})
    noise = {str(n): benches[n].noise.as_json() for n in sizes}
    if control is not None:
        noise["separate"] = control_bench.noise.as_json()
    return {"batchings": out, "noise": noise}
