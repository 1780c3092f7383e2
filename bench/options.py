"""The benchmark's options (command line) and the sizes of a full and a ``--quick`` run."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import cluster_options
from bench.cluster_options import ClusterOptions

RESULTS = Path(__file__).resolve().parent / "results"

# A full run: 100-400 MB per size and trial, bounded so the run takes about five minutes.
FULL_RECORDS = {100: 2_000_000, 1024: 300_000, 16384: 25_000}
QUICK_RECORDS = {100: 3_000, 1024: 2_000, 16384: 300}


@dataclass
class Options:
    """Everything a run needs to know."""

    brokers: list[str] = field(default_factory=lambda: ["edge", "tansu"])
    sizes: list[int] = field(default_factory=lambda: [100, 1024, 16384])
    records: dict[int, int] = field(default_factory=lambda: dict(FULL_RECORDS))
    acks: str = "all"
    linger_ms: float = 5.0
    rate: float = 20_000.0
    latency_size: int = 1024
    latency_seconds: float = 10.0
    latency_warmup: float = 2.0
    extra_latency_lingers: list[float] = field(default_factory=lambda: [1.0])
    # A second consume per trial with this max.partition.fetch.bytes (0: none). Tansu
    # answers about 5 MiB per partition whatever the client asks; this broker keeps to
    # the client's limit (1 MiB by default), as Kafka does. At 5 MiB both send the same.
    wide_fetch_bytes: int = 5 << 20
    # Also produce and consume with librdkafka's C tool (bench/cclient.py), which is not
    # limited by Python at small records; twice the records of the Python runs.
    c_client: bool = True
    partitions_scenario: int = 1000
    partitions_records: int = 10
    partitions_size: int = 1024
    repeat: int = 5
    latency_repeat: int = 3
    cluster: ClusterOptions = field(default_factory=ClusterOptions)
    pin: bool = True
    quick: bool = False
    out: Path = RESULTS
    timeout: float = 180.0
    # The PostgreSQL rows (bench/postgres.py): this broker on postgres:// against the raw
    # limit of the same server (psycopg 3, no broker), when Debian's server is installed.
    postgres: bool = True
    postgres_only: bool = False
    postgres_records: int = 100_000
    postgres_size: int = 1024
    postgres_partitions: int = 4
    postgres_raw_group: int = 100

    def records_for(self, size: int) -> int:
        """How many records the throughput runs use at ``size`` bytes."""
        if size in self.records:
            return self.records[size]
        return 1_000 if self.quick else max(1_000, 200_000_000 // size)


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _floats(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part.strip()]


def _records(text: str) -> dict[int, int] | int:
    if "=" not in text:
        return int(text)
    pairs = (part.split("=", 1) for part in text.split(",") if part.strip())
    return {int(size): int(count) for size, count in pairs}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Run this broker and Tansu one after the other under the same "
                    "librdkafka load; print a table and write JSON and PNG results.")
    parser.add_argument("--quick", action="store_true",
                        help="tiny counts and durations (the smoke test uses this)")
    parser.add_argument("--brokers", default="edge,tansu", help="which brokers (edge,tansu)")
    parser.add_argument("--sizes", type=_ints, help="record sizes in bytes (100,1024,16384)")
    parser.add_argument("--records", type=_records,
                        help="records per throughput run: N for every size, or "
                             "SIZE=N,SIZE=N (default 100=2000000,1024=300000,16384=25000)")
    parser.add_argument("--acks", default="all", help="producer acks (all)")
    parser.add_argument("--linger-ms", type=float, default=5.0, help="producer linger.ms (5)")
    parser.add_argument("--rate", type=float, help="latency run: records/s (20000)")
    parser.add_argument("--latency-size", type=int, default=1024,
                        help="latency run: record bytes (1024)")
    parser.add_argument("--latency-seconds", type=float, help="latency run: measured s (10)")
    parser.add_argument("--latency-warmup", type=float, help="latency run: warm-up s (2)")
    parser.add_argument("--extra-latency-lingers", type=_floats,
                        help="latency run again at these linger.ms values (1; '' for "
                             "none): shows how much of the latency is the linger")
    parser.add_argument("--wide-fetch-bytes", type=int,
                        help="a second consume with this max.partition.fetch.bytes "
                             "(5242880; 0 = none)")
    parser.add_argument("--no-c-client", action="store_true",
                        help="leave out the rdkafka_performance rows (no build)")
    parser.add_argument("--partitions", type=int,
                        help="partition scenario: partitions of the topic (1000)")
    parser.add_argument("--partition-records", type=int,
                        help="partition scenario: records to each partition (10)")
    parser.add_argument("--repeat", type=int,
                        help="trials per throughput figure; the median is reported "
                             "(5; 1 with --quick)")
    parser.add_argument("--latency-repeat", type=int,
                        help="trials per latency figure, median by p99 (3; 1 with --quick)")
    cluster_options.add_arguments(parser)
    parser.add_argument("--no-pin", action="store_true",
                        help="do not pin the broker and the load generators to CPUs")
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="where latest.json, latest.png and latest.md go (bench/results)")
    parser.add_argument("--timeout", type=float, default=180.0,
                        help="give up on one load run after this many seconds")
    parser.add_argument("--no-postgres", action="store_true",
                        help="leave out the PostgreSQL rows (postgres:// against raw psycopg)")
    parser.add_argument("--postgres-only", action="store_true",
                        help="run only the PostgreSQL rows")
    parser.add_argument("--postgres-records", type=int,
                        help="PostgreSQL rows: records per trial (100000; 2000 with --quick)")
    parser.add_argument("--postgres-partitions", type=int,
                        help="PostgreSQL rows: partitions the records are spread over (4)")
    parser.add_argument("--postgres-raw-group", type=int,
                        help="PostgreSQL rows: batches per commit of the raw limit (100)")
    return parser


def parse_options(argv: Sequence[str] | None = None) -> Options:
    """Options from the command line; ``--quick`` changes the defaults, flags still win."""
    args = _parser().parse_args(argv)
    opts = Options(brokers=[b.strip() for b in args.brokers.split(",") if b.strip()],
                   acks=args.acks, linger_ms=args.linger_ms, latency_size=args.latency_size,
                   pin=not args.no_pin, quick=args.quick, out=args.out, timeout=args.timeout,
                   c_client=not args.no_c_client, postgres=not args.no_postgres,
                   postgres_only=args.postgres_only)
    if args.quick:
        opts.records = dict(QUICK_RECORDS)
        opts.rate, opts.latency_seconds, opts.latency_warmup = 2_000.0, 1.0, 0.5
        opts.partitions_scenario, opts.partitions_records = 20, 5
        opts.timeout = min(opts.timeout, 60.0)
        opts.repeat = opts.latency_repeat = 1
        opts.extra_latency_lingers = []
        opts.postgres_records = 2_000
    if args.sizes:
        opts.sizes = args.sizes
    if isinstance(args.records, int):
        opts.records = dict.fromkeys(opts.sizes, args.records)
    elif args.records:
        opts.records.update(args.records)
    opts.repeat = max(1, args.repeat or opts.repeat)
    opts.latency_repeat = max(1, args.latency_repeat or opts.latency_repeat)
    opts.cluster = cluster_options.from_arguments(args, args.quick, args.repeat)
    if args.extra_latency_lingers is not None:
        opts.extra_latency_lingers = args.extra_latency_lingers
    opts.rate = args.rate or opts.rate
    opts.latency_seconds = args.latency_seconds or opts.latency_seconds
    if args.latency_warmup is not None:
        opts.latency_warmup = args.latency_warmup
    if args.wide_fetch_bytes is not None:
        opts.wide_fetch_bytes = max(0, args.wide_fetch_bytes)
    opts.partitions_scenario = args.partitions or opts.partitions_scenario
    opts.postgres_records = args.postgres_records or opts.postgres_records
    opts.postgres_partitions = args.postgres_partitions or opts.postgres_partitions
    opts.postgres_raw_group = args.postgres_raw_group or opts.postgres_raw_group
    opts.partitions_records = args.partition_records or opts.partitions_records
    return opts
