"""What broker-side recompression costs: ``python -m bench.recompress``.

One broker (this one, default settings), two kinds of topic side by side: one whose
``compression.type`` is ``producer`` (batches stored as sent: the fast path) and one that
stores another codec (``--topic-codec``, zstd by default), so that every batch the
producer sends (``--producer-codec``, lz4 by default) is inflated and compressed again.
The same confluent-kafka load generator as the main benchmark (``bench.worker produce``,
acks=all, linger.ms=5) sends compressible 1 KiB text records to each, trials alternating
between them; each figure is the median of ``--repeat`` trials. Printed: records/s, and
the broker's CPU seconds per million records (its own, from ``/proc``), with the
recompressing topic's ratio to the producer topic's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from bench.admin import create_topic, delete_topic
from bench.brokers import EdgeBroker
from bench.options import Options
from bench.pinning import plan_cpus
from bench.runner import Bench, LoadError, run_worker


def _trial(bench: Bench, broker: EdgeBroker, args: argparse.Namespace, codec: str,
           trial: int) -> dict[str, float]:
    topic = f"bench-recompress-{codec}-{trial}"
    create_topic(broker.bootstrap, topic, 1, config={"compression.type": codec})
    try:
        done = run_worker(bench, broker, "produce", topic, size=args.size,
                          count=args.records, compression=args.producer_codec,
                          values="text")
    finally:
        delete_topic(broker.bootstrap, topic)
    if done.load["records"] != args.records:
        raise LoadError(f"{codec}: {done.load['records']} of {args.records} acknowledged")
    seconds = max(float(done.load["seconds"]), 1e-9)
    return {"records_per_s": args.records / seconds,
            "cpu_s_per_million": done.broker_cpu_s / args.records * 1e6}


def run(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Every trial on both topics; per ``compression.type``, the medians and the trials."""
    cpus = plan_cpus(not args.no_pin)
    bench = Bench(Options(timeout=args.timeout, quick=args.quick), cpus)
    broker = EdgeBroker()
    codecs = ["producer", args.topic_codec]
    trials: dict[str, list[dict[str, float]]] = {codec: [] for codec in codecs}
    broker.start(cpus.broker)
    try:
        for trial in range(args.repeat):
            for codec in codecs if trial % 2 == 0 else codecs[::-1]:
                print(f"[bench] {codec}: trial {trial + 1}/{args.repeat}", file=sys.stderr,
                      flush=True)
                trials[codec].append(_trial(bench, broker, args, codec, trial))
    finally:
        broker.stop()
    return {codec: {key: statistics.median(run[key] for run in runs) for key in runs[0]}
            | {"trials": runs} for codec, runs in trials.items()}


def table(args: argparse.Namespace, results: dict[str, dict[str, Any]]) -> str:
    """The Markdown table of a run."""
    fast, slow = results["producer"], results[args.topic_codec]
    lines = [f"Produce of {args.records:,} records of {args.size} B (compressible text), "
             f"producer codec {args.producer_codec}, median of {args.repeat}",
             "",
             "| topic compression.type | records/s | broker CPU s per million records |",
             "|---|---|---|"]
    for codec, row in results.items():
        lines.append(f"| {codec} | {row['records_per_s']:,.0f} | "
                     f"{row['cpu_s_per_million']:.2f} |")
    lines.append(f"| {args.topic_codec} / producer | "
                 f"{_ratio(slow['records_per_s'], fast['records_per_s'])} | "
                 f"{_ratio(slow['cpu_s_per_million'], fast['cpu_s_per_million'])} |")
    return "\n".join(lines)


def _ratio(numerator: float, denominator: float) -> str:
    """``numerator / denominator`` as ``1.23x``; ``n/a`` when the denominator is 0 (a quick
    run's CPU time can be below the clock tick of /proc)."""
    return f"{numerator / denominator:.2f}x" if denominator else "n/a"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.recompress", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024, help="record value bytes")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--producer-codec", default="lz4")
    parser.add_argument("--topic-codec", default="zstd",
                        help="the recompressing topic's compression.type")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--quick", action="store_true",
                        help="2,000 records, one trial (a smoke run)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run and print the table."""
    args = _parser().parse_args(argv)
    if args.quick:
        args.records, args.repeat = 2_000, 1
    print(table(args, run(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
