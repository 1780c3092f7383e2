"""Drive one broker through the scenarios: throughput per size, fixed-rate latency and
the many-partitions memory scenario. Each load generator is its own process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from bench.admin import create_topic
from bench.brokers import Broker, make_broker
from bench.options import Options
from bench.pinning import CpuPlan

MB = 1_000_000


class LoadError(RuntimeError):
    """A load generator failed or lost records."""


@dataclass
class Phase:
    """What a load generator reported, plus the broker's CPU seconds meanwhile."""

    load: dict[str, Any]
    broker_cpu_s: float


def run_worker(broker: Broker, opts: Options, mode: str, topic: str, **extra: Any) -> Phase:
    """Run ``python -m bench.worker MODE`` against ``broker`` and return its result."""
    args = [sys.executable, "-m", "bench.worker", mode, "--bootstrap", broker.bootstrap,
            "--topic", topic, "--acks", opts.acks, "--linger-ms", str(opts.linger_ms),
            "--timeout", str(opts.timeout)]
    for key, value in extra.items():
        args += ["--" + key.replace("_", "-"), str(value)]
    cpu0 = broker.cpu_seconds()
    try:
        out = subprocess.run(args, capture_output=True, text=True, check=False,
                             timeout=opts.timeout + 60)
    except subprocess.TimeoutExpired as exc:
        raise LoadError(f"{mode} on {broker.name} timed out") from exc
    broker.check_alive()
    cpu = broker.cpu_seconds() - cpu0
    if out.returncode != 0 or not out.stdout.strip():
        raise LoadError(f"{mode} on {broker.name} failed ({out.returncode}):\n{out.stderr}")
    load: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if load.get("errors"):
        raise LoadError(f"{mode} on {broker.name}: {load['errors']} errors, "
                        f"first: {load.get('first_error')}")
    return Phase(load, cpu)


def _rates(load: dict[str, Any]) -> dict[str, Any]:
    seconds = max(float(load["seconds"]), 1e-9)
    return {**load, "records_per_s": load["records"] / seconds,
            "mb_per_s": load["bytes"] / seconds / MB}


def throughput(broker: Broker, opts: Options, size: int) -> dict[str, Any]:
    """Produce ``records_for(size)`` records, then consume them all back."""
    topic = f"bench-throughput-{size}"
    create_topic(broker.bootstrap, topic, 1)
    count = opts.records_for(size)
    produced = run_worker(broker, opts, "produce", topic, size=size, count=count)
    if produced.load["records"] != count:
        raise LoadError(f"{broker.name}: {produced.load['records']} of {count} acknowledged")
    consumed = run_worker(broker, opts, "consume", topic, count=count)
    if consumed.load["records"] != count:
        raise LoadError(f"{broker.name}: consumed {consumed.load['records']} of {count}")
    return {
        "size": size, "records": count,
        "produce": {**_rates(produced.load), "broker_cpu_s": produced.broker_cpu_s},
        "consume": {**_rates(consumed.load), "broker_cpu_s": consumed.broker_cpu_s},
    }


def latency(broker: Broker, opts: Options) -> dict[str, Any]:
    """Produce at ``opts.rate`` records/s and report the latency percentiles."""
    topic = "bench-latency"
    create_topic(broker.bootstrap, topic, 1)
    phase = run_worker(broker, opts, "latency", topic, size=opts.latency_size, rate=opts.rate,
                       seconds=opts.latency_seconds, warmup=opts.latency_warmup)
    return {**phase.load, "size": opts.latency_size, "broker_cpu_s": phase.broker_cpu_s}


def many_partitions(name: str, opts: Options, cpus: CpuPlan) -> dict[str, Any]:
    """A fresh broker, one topic of many partitions, a little data in each: peak RSS."""
    broker = make_broker(name)
    broker.start(cpus.broker)
    try:
        idle_rss = broker.peak_rss_bytes()
        topic = "bench-partitions"
        parts = opts.partitions_scenario
        began = time.perf_counter()
        create_topic(broker.bootstrap, topic, parts, timeout=opts.timeout)
        created_s = time.perf_counter() - began
        count = parts * opts.partitions_records
        produced = run_worker(broker, opts, "produce", topic, size=opts.partitions_size,
                              count=count, partitions=parts)
        consumed = run_worker(broker, opts, "consume", topic, count=count)
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


def run_broker(name: str, opts: Options, cpus: CpuPlan) -> dict[str, Any]:
    """All scenarios for one broker; a fresh process for the partitions scenario."""
    broker = make_broker(name)
    result: dict[str, Any] = {"name": name, "label": broker.label, "version": broker.version()}
    print(f"[bench] {name}: starting {result['version']}", file=sys.stderr, flush=True)
    broker.start(cpus.broker)
    try:
        start_cpu = broker.cpu_seconds()
        result["throughput"] = []
        for size in opts.sizes:
            print(f"[bench] {name}: throughput {size} B x {opts.records_for(size)}",
                  file=sys.stderr, flush=True)
            result["throughput"].append(throughput(broker, opts, size))
        print(f"[bench] {name}: latency at {opts.rate:g}/s", file=sys.stderr, flush=True)
        result["latency"] = latency(broker, opts)
        result["cpu_seconds_total"] = broker.cpu_seconds() - start_cpu
        result["peak_rss_mb"] = broker.peak_rss_bytes() / MB
    finally:
        broker.stop()
    print(f"[bench] {name}: {opts.partitions_scenario} partitions", file=sys.stderr, flush=True)
    result["partitions"] = many_partitions(name, opts, cpus)
    return result
