"""Drive one broker through the scenarios: throughput per size, fixed-rate latency and
the many-partitions memory scenario. Each load generator is its own process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from bench import histogram, procstats
from bench.admin import create_topic, delete_topic
from bench.brokers import Broker, make_broker
from bench.options import Options
from bench.pinning import CpuPlan

MB = 1_000_000
CLIENT_BOUND = 0.9
"""A load generator busy this share of the time was the bottleneck, not the broker."""
SETTLE_POLL_S = 0.1
SETTLE_QUIET_POLLS = 2
SETTLE_IDLE_SHARE = 0.05
"""A broker using at most this share of a CPU over ``SETTLE_QUIET_POLLS`` polls in a row
is idle (this one idles below 1%)."""
SETTLE_MAX_S = 5.0
HANDLING_TARGET_S = 0.001
"""Issue 21: the broker's own produce handling p99 under this (a bucket bound of its
request-latency histogram, so the share within it is exact)."""


class LoadError(RuntimeError):
    """A load generator failed or lost records."""


@dataclass
class Phase:
    """What a load generator reported, the broker's CPU seconds meanwhile, and the CPU
    seconds other processes took on the broker's CPUs (noise; ``None`` when not pinned)."""

    load: dict[str, Any]
    broker_cpu_s: float
    others_cpu_s: float | None
    wall_s: float
    load_others_cpu_s: float | None = None


@dataclass
class Noise:
    """Wall time and other processes' CPU time on the broker's CPUs, added up."""

    wall_s: float = 0.0
    others_cpu_s: float | None = 0.0
    load_others_cpu_s: float | None = 0.0

    def add(self, phase: Phase) -> None:
        """Count one phase."""
        self.wall_s += phase.wall_s
        if self.others_cpu_s is not None and phase.others_cpu_s is not None:
            self.others_cpu_s += phase.others_cpu_s
        else:
            self.others_cpu_s = None
        if self.load_others_cpu_s is not None and phase.load_others_cpu_s is not None:
            self.load_others_cpu_s += phase.load_others_cpu_s
        else:
            self.load_others_cpu_s = None

    def share(self, others: float | None) -> float | None:
        """CPU time of others as a share (%) of one CPU's time during the load."""
        if others is None or self.wall_s <= 0:
            return None
        return max(0.0, 100.0 * others / self.wall_s)

    def as_json(self) -> dict[str, float | None]:
        """The totals and the shares."""
        return {"wall_s": self.wall_s, "others_cpu_s": self.others_cpu_s,
                "others_share_pct": self.share(self.others_cpu_s),
                "load_others_cpu_s": self.load_others_cpu_s,
                "load_others_share_pct": self.share(self.load_others_cpu_s)}


@dataclass
class Bench:
    """One broker's run: the options, the CPU plan and the noise seen so far."""

    opts: Options
    cpus: CpuPlan
    noise: Noise = field(default_factory=Noise)
    c_client: str | None = None  # the rdkafka_performance binary, when there is one


def run_worker(bench: Bench, broker: Broker, mode: str, topic: str, **extra: Any) -> Phase:
    """Run ``python -m bench.worker MODE`` against ``broker`` and return its result."""
    opts = bench.opts
    extra.setdefault("linger_ms", opts.linger_ms)
    args = [sys.executable, "-m", "bench.worker", mode, "--bootstrap", broker.bootstrap,
            "--topic", topic, "--acks", opts.acks, "--timeout", str(opts.timeout)]
    for key, value in extra.items():  # a list: the option once per item
        for item in value if isinstance(value, list) else [value]:
            args += ["--" + key.replace("_", "-"), str(item)]
    cpus, load_cpus = bench.cpus.broker, bench.cpus.load
    cpu0, busy0, wall0 = broker.cpu_seconds(), procstats.busy_seconds(cpus), time.monotonic()
    load_busy0 = procstats.busy_seconds(load_cpus)
    try:
        out = subprocess.run(args, capture_output=True, text=True, check=False,
                             timeout=opts.timeout + 60)
    except subprocess.TimeoutExpired as exc:
        raise LoadError(f"{mode} on {broker.name} timed out") from exc
    broker.check_alive()
    settle(broker)
    wall = time.monotonic() - wall0
    cpu = broker.cpu_seconds() - cpu0
    others = None if cpus is None else procstats.busy_seconds(cpus) - busy0 - cpu
    load_busy = procstats.busy_seconds(load_cpus) - load_busy0
    if out.returncode != 0 or not out.stdout.strip():
        raise LoadError(f"{mode} on {broker.name} failed ({out.returncode}):\n{out.stderr}")
    load: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if load.get("errors"):
        raise LoadError(f"{mode} on {broker.name}: {load['errors']} errors, "
                        f"first: {load.get('first_error')}")
    own = float(load.get("process_cpu_s", 0.0))
    load_others = None if load_cpus is None else load_busy - own
    phase = Phase(load, cpu, others, wall, load_others)
    bench.noise.add(phase)
    return phase


def settle(broker: Broker) -> float:
    """Wait until the broker is idle again (at most ``SETTLE_MAX_S``): what a phase left
    for it to do once its load generator was done (this broker's fsync of what was just
    produced) is that phase's cost, not the next one's. The seconds waited."""
    began = time.monotonic()
    quiet = 0
    last = broker.cpu_seconds()
    while quiet < SETTLE_QUIET_POLLS and time.monotonic() - began < SETTLE_MAX_S:
        time.sleep(SETTLE_POLL_S)
        now = broker.cpu_seconds()
        quiet = quiet + 1 if now - last <= SETTLE_IDLE_SHARE * SETTLE_POLL_S else 0
        last = now
    return time.monotonic() - began


def _summary(phase: Phase) -> dict[str, Any]:
    load = phase.load
    seconds = max(float(load["seconds"]), 1e-9)
    return {**load, "records_per_s": load["records"] / seconds,
            "mb_per_s": load["bytes"] / seconds / MB,
            "broker_cpu_s": phase.broker_cpu_s, "others_cpu_s": phase.others_cpu_s,
            "records_per_broker_cpu_s": load["records"] / max(phase.broker_cpu_s, 0.01),
            "client_bound": float(load["client_cpu_s"]) >= CLIENT_BOUND * seconds}


def throughput(bench: Bench, broker: Broker, size: int, trial: int) -> dict[str, Any]:
    """Produce ``records_for(size)`` records, then consume them all back."""
    topic = f"bench-throughput-{size}-{trial}"
    create_topic(broker.bootstrap, topic, 1)
    try:
        row = _throughput(bench, broker, size, topic)
    finally:
        delete_topic(broker.bootstrap, topic)
    if bench.c_client is not None:
        create_topic(broker.bootstrap, topic + "-c", 1)
        try:
            row.update(_c_throughput(bench, broker, size, topic + "-c"))
        finally:
            delete_topic(broker.bootstrap, topic + "-c")
    return row


def _c_throughput(bench: Bench, broker: Broker, size: int, topic: str) -> dict[str, Any]:
    """The same with rdkafka_performance, twice the records (it is that much faster)."""
    count = 2 * bench.opts.records_for(size)
    row = {}
    for phase, mode in (("produce_c", "cproduce"), ("consume_c", "cconsume")):
        done = run_worker(bench, broker, mode, topic, size=size, count=count,
                          binary=bench.c_client)
        if done.load["records"] != count:
            raise LoadError(f"{broker.name}: {mode} handled {done.load['records']} of {count}")
        row[phase] = _summary(done)
    return row


def _throughput(bench: Bench, broker: Broker, size: int, topic: str) -> dict[str, Any]:
    count = bench.opts.records_for(size)
    produced = run_worker(bench, broker, "produce", topic, size=size, count=count)
    if produced.load["records"] != count:
        raise LoadError(f"{broker.name}: {produced.load['records']} of {count} acknowledged")
    row = {"size": size, "records": count, "produce": _summary(produced)}
    phases = [("consume", 0)]
    if bench.opts.wide_fetch_bytes:
        phases.append(("consume_wide", bench.opts.wide_fetch_bytes))
    for phase, fetch_bytes in phases:
        consumed = run_worker(bench, broker, "consume", topic, count=count,
                              partition_fetch_bytes=fetch_bytes)
        if consumed.load["records"] != count:
            raise LoadError(f"{broker.name}: consumed {consumed.load['records']} of {count}")
        row[phase] = _summary(consumed)
    return row


def latency(bench: Bench, broker: Broker, trial: int, linger_ms: float) -> dict[str, Any]:
    """Produce at ``opts.rate`` records/s and report the latency percentiles."""
    opts = bench.opts
    topic = f"bench-latency-{trial}-{linger_ms:g}".replace(".", "_")
    create_topic(broker.bootstrap, topic, 1)
    before = _produce_timings(broker)
    try:
        phase = run_worker(bench, broker, "latency", topic, size=opts.latency_size,
                           rate=opts.rate, seconds=opts.latency_seconds,
                           warmup=opts.latency_warmup, linger_ms=linger_ms)
        timings = _handling(before, _produce_timings(broker))
    finally:
        delete_topic(broker.bootstrap, topic)
    return {**phase.load, "size": opts.latency_size, "linger_ms": linger_ms,
            "broker_cpu_s": phase.broker_cpu_s, "others_cpu_s": phase.others_cpu_s,
            **timings}


def _produce_timings(broker: Broker) -> histogram.Buckets | None:
    """The broker's Produce request-latency buckets, when it serves metrics."""
    if broker.metrics_port is None:
        return None
    return histogram.scrape(broker.metrics_port, histogram.REQUEST_LATENCY, "Produce")


def _handling(before: histogram.Buckets | None,
              after: histogram.Buckets | None) -> dict[str, float | None]:
    """The broker's own produce handling (request decoded to response queued, its
    histogram) over a phase, warm-up included: requests, the bucket bound holding the
    p99, and the share done within ``HANDLING_TARGET_S``."""
    if before is None or after is None:
        return {}
    spent = histogram.between(before, after)
    p99 = histogram.quantile_bound(spent, 0.99)
    return {"handled_requests": histogram.count(spent),
            "handled_p99_bound_ms": None if p99 is None else p99 * 1000,
            "handled_within_target": histogram.share_at_most(spent, HANDLING_TARGET_S)}


def many_partitions(bench: Bench, name: str) -> dict[str, Any]:
    """A fresh broker, one topic of many partitions, a little data in each: peak RSS."""
    opts = bench.opts
    broker = make_broker(name)
    broker.start(bench.cpus.broker)
    try:
        idle_rss = broker.peak_rss_bytes()
        topic = "bench-partitions"
        parts = opts.partitions_scenario
        began = time.perf_counter()
        create_topic(broker.bootstrap, topic, parts, timeout=opts.timeout)
        created_s = time.perf_counter() - began
        count = parts * opts.partitions_records
        produced = run_worker(bench, broker, "produce", topic, size=opts.partitions_size,
                              count=count, partitions=parts)
        consumed = run_worker(bench, broker, "consume", topic, count=count)
        if consumed.load["records"] != count:
            raise LoadError(f"{name}: consumed {consumed.load['records']} of {count}")
        return {
            "partitions": parts, "records": count, "size": opts.partitions_size,
            "create_seconds": created_s, "idle_rss_mb": idle_rss / MB,
            "peak_rss_mb": broker.peak_rss_bytes() / MB,
            "broker_cpu_s": produced.broker_cpu_s + consumed.broker_cpu_s,
        }
    finally:
        broker.stop()
