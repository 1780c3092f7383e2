"""The cluster rows of ``make bench``: 1, 2 and 3 brokers on one PostgreSQL, then failover
with the default membership settings and with a short session. ``python -m bench`` runs
them after the main rows (``--no-cluster`` leaves them out); ``python -m bench.cluster_suite``
runs them alone, with the same options. Results go to ``cluster.json`` and ``cluster.md``
beside ``latest.*``.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import cluster_report
from bench.cluster_db import running_postgres
from bench.cluster_load import cluster_throughput
from bench.failover import failover
from bench.options import Options, parse_options
from bench.pinning import CpuPlan, pin_self, plan_cpus
from bench.report import save_row


def _postgres_version(bin_dir: Path) -> str:
    out = subprocess.run([str(bin_dir / "postgres"), "--version"], capture_output=True,
                         text=True, check=False, timeout=30)
    found = re.search(r"\d+(?:\.\d+)+", out.stdout)  # postgres (PostgreSQL) 15.18 (Debian…)
    return found[0] if found else "?"


def run_cluster(opts: Options, cpus: CpuPlan) -> dict[str, Any]:
    """Every cluster row; the results with their options, setup and targets."""
    began = time.monotonic()
    with running_postgres() as server:
        results: dict[str, Any] = {
            "options": dataclasses.asdict(opts.cluster),
            "meta": {"postgres": _postgres_version(server.bin), "cpus": cpus.describe(),
                     "acks": opts.acks, "linger_ms": opts.linger_ms},
            "throughput": cluster_throughput(opts, cpus, server),
            "failover": [failover(opts, cpus, server, settings)
                         for settings in ({}, opts.cluster.fast_membership)
                         if opts.cluster.kills > 0],
        }
    results["meta"]["seconds"] = round(time.monotonic() - began, 1)
    results["targets"] = cluster_report.targets(results)
    return results


def run_and_save(opts: Options, cpus: CpuPlan) -> str:
    """Run the cluster rows, write ``cluster.json`` and ``cluster.md`` into ``opts.out``,
    return the Markdown."""
    results = run_cluster(opts, cpus)
    text = cluster_report.markdown(results)
    for path in save_row(opts.out, "cluster", results, text):
        print(f"[bench] wrote {path}", file=sys.stderr)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.cluster_suite [--quick] [...]``: the cluster rows alone."""
    opts = parse_options(argv)
    cpus = plan_cpus(opts.pin)
    pin_self(cpus.load)
    print(run_and_save(opts, cpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
