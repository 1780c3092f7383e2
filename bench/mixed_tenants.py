"""The mixed-tenants row: ``python -m bench.mixed_tenants``.

One broker (this one, default settings) with a SASL_SSL listener (PLAIN, HS256 ``token:``
passwords) and a PLAINTEXT one (unused by the load). ``--tenants`` tenants
(``tenant-01`` ...), each logged in as itself (username ``tenant-NN``, a token of its own
whose ``sub`` is the tenant), each with its own topic ``events`` of ``--producers``
partitions, created by the tenant over SASL_SSL. Per tenant one process
(``bench.tenant_worker``) drives ``--producers`` producers and ``--consumers`` consumers,
so ``--tenants`` x (producers + consumers) TLS connections in all. The total rate
``--rate`` (records/s of ``--size`` bytes, acks=all, ``--linger-ms``) is shared evenly by
every producer. After ``--warmup`` seconds (start-up, logins, the first fetches) the
broker's CPU and every record sent during ``--seconds`` are measured: per tenant the
delivery p50/p99 (produce() to delivery report) and the end-to-end p50/p99 (send to the
consumer's poll), the broker's CPU share and its RSS. The machine's load average is
recorded beside them: the load generators share it with everything else.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import procstats
from bench.admin import create_topic
from bench.options import RESULTS
from bench.pinning import CpuPlan, inherited_affinity, pin_self, plan_cpus
from bench.report import save_row
from bench.secure import Material, MultiListenerBroker, TempMaterial, as_flags, client_config
from bench.stats import percentile

PROTOCOL = "SASL_SSL"
TOPIC = "events"


def _tenant_name(index: int) -> str:
    return f"tenant-{index + 1:02d}"


def _start_worker(args: argparse.Namespace, broker: MultiListenerBroker, material: Material,
                  name: str, begin: float, end: float, cpus: CpuPlan
                  ) -> subprocess.Popen[str]:
    config = client_config(PROTOCOL, material, material.token("HS256", sub=name),
                           username=name)
    command = [sys.executable, "-m", "bench.tenant_worker", "--name", name,
               "--bootstrap", broker.address(PROTOCOL), "--topic", TOPIC,
               "--partitions", str(args.producers), "--producers", str(args.producers),
               "--consumers", str(args.consumers),
               "--rate", f"{args.rate / (args.tenants * args.producers):g}",
               "--size", str(args.size), "--linger-ms", f"{args.linger_ms:g}",
               "--begin", f"{begin:.6f}", "--end", f"{end:.6f}",
               "--timeout", f"{args.timeout:g}"]
    for flag in as_flags(config):
        command += ["--config", flag]
    with inherited_affinity(cpus.load):
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _sleep_until(moment: float) -> None:
    while (left := moment - time.time()) > 0:
        time.sleep(min(left, 0.5))


def _tenant_row(result: dict[str, Any]) -> dict[str, Any]:
    delivery, e2e = result.pop("delivery_ms"), result.pop("e2e_ms")
    return {**result, "records_per_s": result["delivered"] / result["seconds"],
            "missing": max(0, result["measured_sent"] - result["received"]),
            "delivery_p50_ms": percentile(delivery, 50),
            "delivery_p99_ms": percentile(delivery, 99),
            "e2e_p50_ms": percentile(e2e, 50), "e2e_p99_ms": percentile(e2e, 99),
            "e2e_max_ms": e2e[-1] if e2e else 0.0}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the broker, create the topics, run every tenant; the rows and the totals."""
    cpus = plan_cpus(not args.no_pin)
    pin_self(cpus.load)
    load_before = os.getloadavg()
    names = [_tenant_name(i) for i in range(args.tenants)]
    with TempMaterial() as material:
        broker = MultiListenerBroker(["PLAINTEXT", PROTOCOL], {**material.tls_settings(),
                                                               **material.hs256_settings()})
        broker.start(cpus.broker)
        try:
            for name in names:
                create_topic(broker.address(PROTOCOL), TOPIC, args.producers,
                             client=client_config(PROTOCOL, material,
                                                  material.token("HS256", sub=name),
                                                  username=name))
            begin = time.time() + args.warmup
            end = begin + args.seconds
            workers = [_start_worker(args, broker, material, name, begin, end, cpus)
                       for name in names]
            _sleep_until(begin)
            cpu0, busy0 = procstats.cpu_seconds(broker.pid), procstats.busy_seconds(None)
            _sleep_until(end)
            cpu1, busy1 = procstats.cpu_seconds(broker.pid), procstats.busy_seconds(None)
            rss = procstats.rss_bytes(broker.pid)
            peak = procstats.peak_rss_bytes(broker.pid)
            outputs = []
            for name, worker in zip(names, workers, strict=True):
                out, err = worker.communicate(timeout=args.timeout * 3 + 60)
                if worker.returncode != 0 or not out.strip():
                    raise RuntimeError(f"{name} worker failed: {err[-2000:]}")
                outputs.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            broker.stop()
    delivery = sorted(v for o in outputs for v in o["delivery_ms"])
    e2e = sorted(v for o in outputs for v in o["e2e_ms"])
    rows = [_tenant_row(o) for o in outputs]
    seconds = end - begin
    total = {"records_per_s": len(delivery) / seconds,
             "delivery_p50_ms": percentile(delivery, 50),
             "delivery_p99_ms": percentile(delivery, 99),
             "e2e_p50_ms": percentile(e2e, 50), "e2e_p99_ms": percentile(e2e, 99),
             "errors": sum(r["errors"] for r in rows), "missing": sum(r["missing"] for r in rows),
             "late_tenants": sum(r["late_s"] > 0 for r in rows)}
    return {"rows": rows, "total": total,
            "broker": {"cpu_share": (cpu1 - cpu0) / seconds, "rss_mb": rss / 1e6,
                       "peak_rss_mb": peak / 1e6},
            "machine": {"cpus": os.cpu_count(), "busy_share": (busy1 - busy0) / seconds,
                        "load_before": load_before, "load_after": os.getloadavg()},
            "cpus": cpus.describe(),
            "options": {key: getattr(args, key) for key in
                        ("tenants", "producers", "consumers", "rate", "size", "linger_ms",
                         "seconds", "warmup")}}


def table(results: dict[str, Any]) -> str:
    """The Markdown table: one row per tenant, then all tenants together."""
    opt, total, broker, machine = (results[k] for k in ("options", "total", "broker",
                                                         "machine"))
    clients = opt["tenants"] * (opt["producers"] + opt["consumers"])
    lines = [f"Mixed tenants: {opt['tenants']} tenants x {opt['producers']} producers x "
             f"{opt['consumers']} consumers ({clients} SASL_SSL connections, PLAIN with HS256 "
             f"tokens), {opt['rate']:,.0f} records/s of {opt['size']:,} B in all, acks=all, "
             f"linger.ms={opt['linger_ms']:g}, {opt['seconds']:g} s measured after "
             f"{opt['warmup']:g} s warm-up; {results['cpus']}. Load average "
             f"{machine['load_before'][0]:.2f} before, {machine['load_after'][0]:.2f} after "
             f"(1 min; {machine['busy_share']:.2f} of {machine['cpus']} CPUs busy meanwhile).", "",
             "| tenant | records/s | delivery p50 / p99 ms | end-to-end p50 / p99 ms | "
             "end-to-end max ms | errors / missing |", "|---|--:|--:|--:|--:|--:|"]
    for row in results["rows"]:
        late = f" (late {row['late_s']:.1f} s)" if row["late_s"] > 0 else ""
        lines.append(f"| {row['name']}{late} | {row['records_per_s']:,.0f} | "
                     f"{row['delivery_p50_ms']:.1f} / {row['delivery_p99_ms']:.1f} | "
                     f"{row['e2e_p50_ms']:.1f} / {row['e2e_p99_ms']:.1f} | "
                     f"{row['e2e_max_ms']:.0f} | {row['errors']} / {row['missing']} |")
    lines.append(f"| **all** | {total['records_per_s']:,.0f} | "
                 f"{total['delivery_p50_ms']:.1f} / {total['delivery_p99_ms']:.1f} | "
                 f"{total['e2e_p50_ms']:.1f} / {total['e2e_p99_ms']:.1f} | | "
                 f"{total['errors']} / {total['missing']} |")
    p99s = [row["delivery_p99_ms"] for row in results["rows"]]
    worst = max(results["rows"], key=lambda row: row["delivery_p99_ms"])
    lines += ["", f"- Delivery p99 across tenants: median {statistics.median(p99s):.1f} ms, "
                  f"worst {worst['delivery_p99_ms']:.1f} ms ({worst['name']}), "
                  f"{worst['delivery_p99_ms'] / max(statistics.median(p99s), 1e-9):.1f}x "
                  f"the median.",
              f"- Broker: {broker['cpu_share']:.0%} of a core, RSS {broker['rss_mb']:.0f} MB "
              f"(peak {broker['peak_rss_mb']:.0f} MB)."]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.mixed_tenants", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--producers", type=int, default=5, help="per tenant")
    parser.add_argument("--consumers", type=int, default=5, help="per tenant")
    parser.add_argument("--rate", type=float, default=400.0,
                        help="records/s in all (1,000 already saturates this broker)")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--linger-ms", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=20.0, help="measured")
    parser.add_argument("--warmup", type=float, default=15.0,
                        help="seconds for start-up and logins before measuring")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--quick", action="store_true",
                        help="2 tenants x 1 producer x 1 consumer, 200 records/s, 3 s")
    return parser


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The options; ``--quick`` replaces the sizes with a smoke run's."""
    args = _parser().parse_args(argv)
    if args.quick:
        args.tenants, args.producers, args.consumers = 2, 1, 1
        args.rate, args.seconds, args.warmup = 200.0, 3.0, 8.0
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run, print the table, save ``mixed_tenants.json`` and ``.md`` in ``--out``."""
    args = parse_args(argv)
    results = run(args)
    text = table(results)
    print(text, flush=True)
    save_row(args.out, "mixed_tenants", results, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
