"""Fixed-rate produce latency of this broker and Tansu, interleaved, with this broker's own
produce-handling histogram (``kop_server_request_latency_seconds{api="Produce"}``) scraped
from ``/metrics`` before and after each trial.

``python -m bench.latency_probe --trials 5 --linger-ms 1 [--set key=value ...]``: the
harness's :func:`bench.runner.latency` (one ``bench.worker latency`` process per trial, the
broker on the first CPU, the load generator on the others), one JSON line per trial and a
summary (medians and worst) at the end. ``--set`` passes settings to this broker.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import statistics
import sys
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

from bench import procstats
from bench.brokers import Broker, EdgeBroker, make_broker
from bench.options import Options
from bench.pinning import pin_self, plan_cpus
from bench.runner import Bench, latency

_BUCKET = re.compile(
    r'^kop_server_request_latency_seconds_bucket\{api="Produce",le="([^"]+)"\} (\S+)$')


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def scrape(port: int) -> dict[float, float]:
    """The Produce request-latency histogram's cumulative buckets, by upper bound."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        match = _BUCKET.match(line)
        if match:
            buckets[float(match.group(1))] = float(match.group(2))
    return buckets


def histogram_summary(before: dict[float, float], after: dict[float, float]) -> dict[str, Any]:
    """Requests in the window, the share at or under 0.5 ms and 1 ms, and the bucket bound
    holding the 99th and 99.9th percentile."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    out: dict[str, Any] = {"requests": total}
    if total <= 0:
        return out
    for bound, count in zip(bounds, counts, strict=True):
        if bound in (0.0005, 0.001, 0.0025, 0.005):
            out[f"le_{bound * 1000:g}ms_pct"] = round(100 * count / total, 3)
    for name, q in (("p99_le_ms", 0.99), ("p999_le_ms", 0.999)):
        out[name] = next((b * 1000 for b, c in zip(bounds, counts, strict=True)
                          if c >= q * total), float("inf"))
    out["over_1ms"] = total - next(c for b, c in zip(bounds, counts, strict=True)
                                   if b == 0.001)
    return out


def _trial(bench: Bench, broker: Broker, trial: int, linger: float,
           metrics_port: int | None) -> dict[str, Any]:
    before = scrape(metrics_port) if metrics_port else {}
    busy0, wall0 = procstats.busy_seconds(bench.cpus.broker), time.monotonic()
    row = latency(bench, broker, trial, linger)
    wall = time.monotonic() - wall0
    others = row.get("others_cpu_s")
    keep = ("p50_ms", "p99_ms", "p999_ms", "max_ms", "rtt_p50_ms", "rtt_p99_ms",
            "rtt_max_ms", "broker_cpu_s", "achieved_rate")
    out: dict[str, Any] = {"broker": broker.name, "trial": trial,
                           **{k: round(float(row[k]), 3) for k in keep if k in row}}
    out["others_share_pct"] = None if others is None else round(100 * others / wall, 1)
    out["broker_cpu_busy_pct"] = round(
        100 * (procstats.busy_seconds(bench.cpus.broker) - busy0) / wall, 1)
    if metrics_port:
        out["produce_hist"] = histogram_summary(before, scrape(metrics_port))
    return out


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"trials": len(rows)}
    for key in ("p50_ms", "p99_ms", "p999_ms", "others_share_pct"):
        values = [r[key] for r in rows if r.get(key) is not None]
        if values:
            out[key + "_median"] = round(statistics.median(values), 3)
            out[key + "_max"] = round(max(values), 3)
    hists = [r["produce_hist"] for r in rows if "produce_hist" in r]
    if hists:
        out["hist_over_1ms_total"] = sum(h.get("over_1ms", 0) for h in hists)
        out["hist_requests_total"] = sum(h.get("requests", 0) for h in hists)
        out["hist_p99_le_ms_worst"] = max(h.get("p99_le_ms", 0) for h in hists)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.latency_probe")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--linger-ms", type=float, default=1.0)
    parser.add_argument("--rate", type=float, default=20_000.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--brokers", default="edge,tansu")
    parser.add_argument("--set", action="append", default=[], help="edge setting key=value")
    parser.add_argument("--variant", action="append", default=[],
                        help="another edge broker NAME:key=value,key=value (beside 'edge')")
    args = parser.parse_args(argv)
    opts = Options(rate=args.rate, latency_seconds=args.seconds)
    cpus = plan_cpus(True)
    pin_self(cpus.load)
    metrics_port = _free_port()
    settings = dict(item.split("=", 1) for item in args.set)
    settings.setdefault("metricsPort", str(metrics_port))
    metrics_port = int(settings["metricsPort"])
    brokers: dict[str, Broker] = {}
    ports: dict[str, int] = {}
    for name in args.brokers.split(","):
        brokers[name] = EdgeBroker(settings) if name == "edge" else make_broker(name)
        if name == "edge":
            ports[name] = metrics_port
    for variant in args.variant:
        name, _, pairs = variant.partition(":")
        ports[name] = _free_port()
        extra = dict(item.split("=", 1) for item in pairs.split(",") if item)
        brokers[name] = EdgeBroker({**settings, **extra, "metricsPort": str(ports[name])})
        brokers[name].name = name
    benches = {name: Bench(opts, cpus) for name in brokers}
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in brokers}
    try:
        for broker in brokers.values():
            broker.start(cpus.broker)
        names = list(brokers)
        for trial in range(args.trials):
            order = names if trial % 2 == 0 else names[::-1]
            for name in order:
                port = ports.get(name)
                row = _trial(benches[name], brokers[name], trial, args.linger_ms, port)
                rows[name].append(row)
                print(json.dumps(row), flush=True)
    finally:
        for broker in brokers.values():
            broker.stop()
    for name, trials in rows.items():
        print(json.dumps({"summary": name, **_summary(trials)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
