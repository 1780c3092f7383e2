"""What the log cleaner does and costs: ``python -m bench.cleaner``.

One broker (this one, file storage, ``logCleanerBackoffMs=500``), one run per
``logCleanerIoMaxBytesPerSecond`` of ``--io-max`` (default: the broker's default, 50 MiB/s,
and 0 = no limit). Each run fills a topic of ``--partitions`` partitions with
``--records`` keyed records (``--keys`` distinct keys, ``--size`` bytes of value; 1 MiB
segments) while its ``cleanup.policy`` is still ``delete`` (then ``--settle`` seconds
pass, for the fill's writeback); then a fixed-rate producer
(the main benchmark's ``latency`` load generator: ``--rate`` records/s of 1 KiB on
another topic, acks=all, linger.ms=5) runs three times: with nothing to clean, right
after the filled topic is switched to ``compact`` (IncrementalAlterConfigs) while the
cleaner works through it, and once more when the cleaner is done (the two idle runs
bracket the busy one, so that load from elsewhere on the machine shows as a difference
between them).

Printed per run: the cleaner's throughput (bytes of log on disk before cleaning, divided
by the time from its first ``cleaning`` line to its last ``cleaned`` line for the topic),
the log's size before and after, the producer's p50 / p99 / p99.9 in each of its three
runs, and how much of the busy run's measured window the cleaning covered.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.admin import create_topic, delete_topic, set_topic_configs
from bench.brokers import EdgeBroker
from bench.options import Options
from bench.pinning import plan_cpus
from bench.report import save_row
from bench.runner import Bench, LoadError, run_worker

MB = 1e6
DEFAULT_IO_MAX = 52428800
"""The broker's ``logCleanerIoMaxBytesPerSecond`` default (Kafka's is unlimited)."""
CLEANING, CLEANED = "log cleaner: cleaning ", "log cleaner: cleaned "


class CleanerBroker(EdgeBroker):
    """This broker, noting when each log-cleaner line arrived (epoch seconds)."""

    def __init__(self, settings: dict[str, str]) -> None:
        super().__init__(settings)
        self.cleaner_lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()

    def _on_line(self, line: str, ready: threading.Event) -> None:
        if CLEANING in line or CLEANED in line:
            with self._lock:
                self.cleaner_lines.append((time.time(), line))
        super()._on_line(line, ready)

    def cleaner_times(self, topic: str, marker: str) -> list[float]:
        """When the lines with ``marker`` about ``topic``'s partitions arrived."""
        with self._lock:
            return [at for at, line in self.cleaner_lines
                    if marker in line and f"/{topic}/" in line.replace(os.sep, "/")]

    def topic_bytes(self, topic: str) -> int:
        """Bytes of ``topic``'s files on disk."""
        assert self._tmp is not None
        total = 0
        for root, _dirs, files in os.walk(self._tmp.name):
            if f"/{topic}/" in Path(root).as_posix() + "/":
                total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
        return total


def _latency(bench: Bench, broker: EdgeBroker, args: argparse.Namespace,
             name: str) -> dict[str, Any]:
    topic = f"bench-cleaner-latency-{name}"
    create_topic(broker.bootstrap, topic, 1)
    try:
        done = run_worker(bench, broker, "latency", topic, size=1024, rate=args.rate,
                          seconds=args.seconds, warmup=args.warmup)
    finally:
        delete_topic(broker.bootstrap, topic)
    return done.load


def _wait_cleaned(broker: CleanerBroker, topic: str, partitions: int,
                  timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(broker.cleaner_times(topic, CLEANED)) < partitions:
        broker.check_alive()
        if time.monotonic() > deadline:
            raise LoadError(f"the cleaner did not clean {topic} within {timeout:.0f} s:\n"
                            + broker.log_tail())
        time.sleep(0.2)


def one_run(args: argparse.Namespace, bench: Bench, io_max: int) -> dict[str, Any]:
    """Fill, measure the producer idle, switch to compact, measure it while cleaning."""
    broker = CleanerBroker({"logCleanerBackoffMs": "500",
                            "logCleanerIoMaxBytesPerSecond": str(io_max)})
    topic = f"bench-cleaner-{io_max}"
    broker.start(bench.cpus.broker)
    try:
        create_topic(broker.bootstrap, topic, args.partitions, config={
            "cleanup.policy": "delete", "segment.bytes": str(1 << 20),
            "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "0"})
        filled = run_worker(bench, broker, "produce", topic, size=args.size,
                            count=args.records, keys=args.keys, partitions=args.partitions)
        if filled.load["records"] != args.records:
            raise LoadError(f"fill: {filled.load['records']} of {args.records} acknowledged")
        before = broker.topic_bytes(topic)
        time.sleep(args.settle)  # the fill's writeback and fsyncs out of the way
        idle = _latency(bench, broker, args, "idle")
        print(f"[bench] io max {io_max}: {before / MB:.0f} MB to clean", file=sys.stderr,
              flush=True)
        set_topic_configs(broker.bootstrap, topic, {"cleanup.policy": "compact"})
        busy = _latency(bench, broker, args, "cleaning")
        _wait_cleaned(broker, topic, args.partitions, args.timeout)
        after = broker.topic_bytes(topic)
        idle_after = _latency(bench, broker, args, "idle-after")
        started = min(broker.cleaner_times(topic, CLEANING))
        ended = max(broker.cleaner_times(topic, CLEANED))
    finally:
        broker.stop()
    window_start, window_end = busy["window_unix"]
    overlap = max(0.0, min(ended, window_end) - max(started, window_start))
    seconds = max(ended - started, 1e-6)
    return {"io_max": io_max, "log_bytes_before": before, "log_bytes_after": after,
            "cleaning_seconds": seconds, "cleaner_mb_per_s": before / MB / seconds,
            "window_covered": overlap / max(window_end - window_start, 1e-6),
            "idle": idle, "cleaning": busy, "idle_after": idle_after}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One run per ``--io-max``."""
    cpus = plan_cpus(not args.no_pin)
    bench = Bench(Options(timeout=args.timeout, quick=args.quick), cpus)
    return [one_run(args, bench, io_max) for io_max in args.io_max]


def _cap(io_max: int) -> str:
    return "no limit" if io_max == 0 else f"{io_max / (1 << 20):g} MiB/s"


def table(args: argparse.Namespace, results: list[dict[str, Any]]) -> str:
    """The Markdown table of a run."""
    lines = [f"Cleaner: {args.records:,} records of {args.size} B over {args.keys} keys in "
             f"{args.partitions} partition(s); producer: {args.rate:,.0f} records/s of "
             f"1 KiB for {args.seconds:g} s (acks=all, linger.ms=5)",
             "",
             "| logCleanerIoMaxBytesPerSecond | log before → after (MB) | cleaner MB/s "
             "| produce p50 / p99 / p99.9 ms: idle before | cleaner running | idle after "
             "| window covered |",
             "|---|---|---|---|---|---|---|"]
    for row in results:
        shown = [" / ".join(f"{row[run][p]:.1f}" for p in ("p50_ms", "p99_ms", "p999_ms"))
                 for run in ("idle", "cleaning", "idle_after")]
        lines.append(
            f"| {_cap(row['io_max'])} | {row['log_bytes_before'] / MB:,.0f} → "
            f"{row['log_bytes_after'] / MB:,.1f} | {row['cleaner_mb_per_s']:,.1f} | "
            f"{' | '.join(shown)} | {row['window_covered']:.0%} |")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.cleaner", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--size", type=int, default=1024, help="record value bytes")
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--io-max", type=int, nargs="+", default=[DEFAULT_IO_MAX, 0],
                        help="logCleanerIoMaxBytesPerSecond of each run (0: no limit)")
    parser.add_argument("--rate", type=float, default=5_000.0, help="producer records/s")
    parser.add_argument("--seconds", type=float, default=5.0, help="producer measured time")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--settle", type=float, default=3.0,
                        help="seconds between the fill and the first producer run")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--out", type=Path,
                        help="also write cleaner.md and cleaner.json there (bench/results)")
    parser.add_argument("--quick", action="store_true",
                        help="20,000 records, 2 s of producer, one run (a smoke run)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run and print the table."""
    args = _parser().parse_args(argv)
    if args.quick:
        args.records, args.seconds, args.io_max = 20_000, 2.0, args.io_max[:1]
        args.settle = 0.0
    results = run(args)
    text = table(args, results)
    print(text, flush=True)
    if args.out is not None:
        options = {key: str(value) if isinstance(value, Path) else value
                   for key, value in vars(args).items()}
        save_row(args.out, "cleaner", {"options": options, "runs": results}, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
