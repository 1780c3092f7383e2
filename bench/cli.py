"""``python -m bench``: run the brokers one after the other, print and save the results."""

from __future__ import annotations

import dataclasses
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import report, verdicts
from bench.cclient import find_or_build
from bench.chart import write_chart
from bench.cluster_suite import run_and_save as run_cluster_rows
from bench.options import Options, parse_options
from bench.pinning import CpuPlan, pin_self, plan_cpus
from bench.postgres import markdown as postgres_markdown
from bench.postgres import run_postgres
from bench.postgres import target as postgres_target
from bench.report import save_row
from bench.runner import Bench
from bench.suite import run_suite
from edge.local_postgres import PostgresError, server_bin_dir

RESULT_FILES = ("latest.json", "latest.md", "latest.png")


def _meta(cpus: CpuPlan) -> dict[str, Any]:
    import confluent_kafka

    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": f"{platform.machine()}, {_cpu_model()}",
        "cpus": cpus.describe(),
        "python": platform.python_version(),
        "confluent_kafka": confluent_kafka.version()[0],
        "librdkafka": confluent_kafka.libversion()[0],
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _options_json(opts: Options) -> dict[str, Any]:
    data = dataclasses.asdict(opts)
    data["out"] = str(opts.out)
    data["records"] = {str(size): opts.records_for(size) for size in opts.sizes}
    return data


def save(results: dict[str, Any], text: str, out: Path) -> list[Path]:
    """Write latest.json, latest.md and latest.png into ``out`` (replacing older ones)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in RESULT_FILES:
        (out / name).unlink(missing_ok=True)
    written = save_row(out, "latest", results, text)
    if write_chart(results, out / "latest.png"):
        written.append(out / "latest.png")
    else:
        print("[bench] chart skipped: matplotlib is not installed", file=sys.stderr)
    return written


def _postgres(opts: Options, cpus: CpuPlan) -> dict[str, Any] | None:
    """The PostgreSQL rows, when asked for and Debian's server binaries are here."""
    if not (opts.postgres or opts.postgres_only):
        return None
    try:
        server_bin_dir()
    except PostgresError as exc:
        print(f"[bench] PostgreSQL rows skipped: {exc}", file=sys.stderr)
        return None
    # the C client's consume decides the consume target; without it, the Python consumer's
    return run_postgres(Bench(opts, cpus, c_client=find_or_build() if opts.c_client else None))


def main(argv: Sequence[str] | None = None) -> int:
    """Run every scenario on every broker; print the table and the targets."""
    opts = parse_options(argv)
    cpus = plan_cpus(opts.pin)
    pin_self(cpus.load)
    began = time.monotonic()
    results: dict[str, Any] = {"meta": _meta(cpus), "options": _options_json(opts),
                               "brokers": {}}
    if not opts.postgres_only:
        results["brokers"] = run_suite(opts, cpus)
    postgres = _postgres(opts, cpus)
    results["meta"]["seconds"] = round(time.monotonic() - began, 1)
    if not opts.postgres_only:
        results["targets"] = verdicts.targets(results)
        text = report.markdown(results)
        print(text)
        for path in save(results, text, opts.out):
            print(f"[bench] wrote {path}", file=sys.stderr)
    if postgres is not None:  # postgres.json, postgres.md
        check = postgres_target(postgres)
        text = "\n\n".join((postgres_markdown(postgres), report.targets_text([check])))
        print("\n" + text)
        for path in save_row(opts.out, "postgres", {"meta": results["meta"],
                                                    "postgres": postgres,
                                                    "targets": [check]}, text):
            print(f"[bench] wrote {path}", file=sys.stderr)
    if opts.cluster.enabled and not opts.postgres_only:  # cluster.json, cluster.md
        print("\n" + run_cluster_rows(opts, cpus))
    print(f"[bench] done in {results['meta']['seconds']} s", file=sys.stderr)
    return 0
