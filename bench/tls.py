"""The TLS rows: ``python -m bench.tls``.

One broker (this one, default settings) with a PLAINTEXT, an SSL and a SASL_SSL listener
(PLAIN, an HS256 ``token:`` password); per record size, librdkafka's C load generator
``rdkafka_performance`` built with OpenSSL (``bench/cclient.py``) produces ``--records``
records over each listener in turn and reads them back (acks=all, linger.ms=5, one
partition, as the main rows), trials rotating the order of the listeners. Each figure is
the median of ``--repeat`` trials; beside it the broker's CPU seconds per GB.

The limit is one core's AES-128-GCM throughput at 16 KiB blocks (TLS records are at most
16 KiB) from ``openssl speed -evp aes-128-gcm``, run on the broker's CPU before the
broker starts. The target: TLS consume at least half of it.

Tansu is not measured: its 0.6.0 command line refuses ``--cert`` together with ``--key``
("cannot be used with"), and with either alone its listener still speaks plain Kafka (a
TLS ClientHello is read as a frame: "early eof"), so it has no TLS listener to compare.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.admin import create_topic, delete_topic
from bench.cclient import find_or_build
from bench.options import RESULTS, Options
from bench.pinning import inherited_affinity, pin_self, plan_cpus
from bench.report import save_row
from bench.runner import Bench, LoadError, _summary, run_worker
from bench.secure import MultiListenerBroker, TempMaterial, as_flags, client_config

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_SSL")
MB = 1_000_000
TANSU_NOTE = ("Tansu 0.6.0 has no usable TLS listener: its CLI refuses --cert with --key, "
              "and with either alone the listener stays plaintext")


def aes_gcm_limit(cpus: frozenset[int] | None, seconds: int = 3) -> dict[str, float]:
    """``openssl speed -evp aes-128-gcm`` on ``cpus``: MB/s per block size (bytes)."""
    with inherited_affinity(cpus):
        out = subprocess.run(["openssl", "speed", "-seconds", str(seconds), "-evp",
                              "aes-128-gcm"], capture_output=True, text=True, check=True,
                             timeout=120).stdout
    header = next(line for line in out.splitlines() if line.startswith("type"))
    row = next(line for line in out.splitlines() if line.upper().startswith("AES-128-GCM"))
    sizes = [int(size) for size in re.findall(r"(\d+) bytes", header)]
    rates = [float(value) for value in re.findall(r"([\d.]+)k", row)]
    return {str(size): rate * 1000 / MB for size, rate in zip(sizes, rates, strict=True)}


def _trial(bench: Bench, broker: MultiListenerBroker, config: dict[str, dict[str, str]],
           protocol: str, size: int, count: int, tag: str) -> dict[str, Any]:
    topic = f"bench-tls-{size}-{protocol.lower()}-{tag}"
    create_topic(broker.bootstrap, topic, 1)
    row: dict[str, Any] = {}
    try:
        for phase, mode in (("produce", "cproduce"), ("consume", "cconsume")):
            done = run_worker(bench, broker, mode, topic, size=size, count=count,
                              binary=bench.c_client, bootstrap=broker.address(protocol),
                              config=as_flags(config[protocol]))
            if done.load["records"] != count:
                raise LoadError(f"{protocol} {mode}: {done.load['records']} of {count}")
            row[phase] = _summary(done)
    finally:
        delete_topic(broker.bootstrap, topic)
    return row


def _median(trials: list[dict[str, Any]], phase: str, key: str) -> float:
    return statistics.median(float(trial[phase][key]) for trial in trials)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every trial; per size and protocol the medians and the trials."""
    cpus = plan_cpus(not args.no_pin)
    pin_self(cpus.load)
    binary = find_or_build()
    if binary is None:
        raise SystemExit("no TLS-capable rdkafka_performance")
    limit = aes_gcm_limit(cpus.broker, 1 if args.quick else 3)
    bench = Bench(Options(timeout=args.timeout, quick=args.quick), cpus, c_client=binary)
    began = time.monotonic()
    rows: dict[str, dict[str, Any]] = {}
    with TempMaterial() as material:
        token = material.token("HS256")
        config = {protocol: client_config(protocol, material, token) for protocol in PROTOCOLS}
        broker = MultiListenerBroker(list(PROTOCOLS), {**material.tls_settings(),
                                                       **material.hs256_settings()})
        broker.start(cpus.broker)
        try:
            for trial in range(args.repeat):
                order = PROTOCOLS[trial % 3:] + PROTOCOLS[:trial % 3]
                for size in args.sizes:
                    for protocol in order:
                        print(f"[bench] tls {size} B {protocol}: trial {trial + 1}/"
                              f"{args.repeat}", file=sys.stderr, flush=True)
                        got = _trial(bench, broker, config, protocol, size,
                                     args.records_for[size], f"{trial}")
                        rows.setdefault(f"{size} {protocol}", {"trials": []})["trials"].append(
                            got)
        finally:
            broker.stop()
    for key, row in rows.items():
        size, protocol = key.split()
        trials = row["trials"]
        row.update({"size": int(size), "protocol": protocol})
        for phase in ("produce", "consume"):
            row[phase] = {
                "mb_per_s": _median(trials, phase, "mb_per_s"),
                "records_per_s": _median(trials, phase, "records_per_s"),
                "broker_cpu_s_per_gb": statistics.median(
                    t[phase]["broker_cpu_s"] / max(t[phase]["bytes"], 1) * 1e9 for t in trials),
                "client_bound": sum(bool(t[phase]["client_bound"]) for t in trials)
                > len(trials) / 2,
            }
    return {"limit_aes_128_gcm_mb_per_s": limit, "rows": rows, "cpus": cpus.describe(),
            "options": {"sizes": args.sizes, "records": args.records_for,
                        "repeat": args.repeat}, "tansu": TANSU_NOTE,
            "seconds": time.monotonic() - began}


def table(results: dict[str, Any]) -> str:
    """The Markdown table and the target."""
    limit = results["limit_aes_128_gcm_mb_per_s"]["16384"]
    rows = results["rows"]
    lines = [f"TLS: rdkafka_performance (OpenSSL), acks=all, linger.ms=5, one partition, "
             f"median of {results['options']['repeat']} trials; {results['cpus']}. "
             f"Limit: one core's AES-128-GCM at 16 KiB blocks (openssl speed) = "
             f"{limit:,.0f} MB/s.", "",
             "| size | listener | produce MB/s | consume MB/s | consume / limit | "
             "broker CPU s per GB, produce / consume |", "|---|---|--:|--:|--:|--:|"]
    verdicts = []
    for key, row in rows.items():
        produce, consume = row["produce"], row["consume"]
        mark = {phase: " (c)" if row[phase]["client_bound"] else "" for phase in
                ("produce", "consume")}
        lines.append(f"| {row['size']:,} B | {row['protocol']} | {produce['mb_per_s']:,.1f}"
                     f"{mark['produce']} | {consume['mb_per_s']:,.1f}{mark['consume']} | "
                     f"{consume['mb_per_s'] / limit:.0%} | "
                     f"{produce['broker_cpu_s_per_gb']:.2f} / "
                     f"{consume['broker_cpu_s_per_gb']:.2f} |")
        if row["protocol"] != "PLAINTEXT":
            verdicts.append(f"{key} {consume['mb_per_s'] / limit:.0%}")
    met = all(rows[k]["consume"]["mb_per_s"] >= limit / 2 for k in rows
              if rows[k]["protocol"] != "PLAINTEXT")
    lines += ["", f"- TLS consume >= 50% of one core's AES-128-GCM: "
                  f"**{'met' if met else 'NOT met'}** ({', '.join(verdicts)})",
              f"- {results['tansu']}."]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.tls", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1024,16384")
    parser.add_argument("--records", default="1024=400000,16384=40000",
                        help="records per size (SIZE=N,...), or one count for all")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--quick", action="store_true", help="2,000 records, one trial")
    return parser


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The options, with ``sizes`` a list and ``records_for`` a dict by size."""
    args = _parser().parse_args(argv)
    args.sizes = [int(size) for size in args.sizes.split(",")]
    if "=" in args.records:
        counts = {int(k): int(v) for k, v in (p.split("=") for p in args.records.split(","))}
    else:
        counts = dict.fromkeys(args.sizes, int(args.records))
    if args.quick:
        counts, args.repeat = dict.fromkeys(args.sizes, 2_000), 1
    args.records_for = {size: counts[size] for size in args.sizes}
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run, print the table, save ``tls.json`` and ``tls.md`` in ``--out``."""
    args = parse_args(argv)
    results = run(args)
    text = table(results)
    print(text, flush=True)
    save_row(args.out, "tls", results, text)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
