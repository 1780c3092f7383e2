"""Options of the cluster rows (several brokers on one PostgreSQL, and failover): their
defaults, the ``--quick`` sizes and the command-line flags that set them."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

FAST_MEMBERSHIP = {"brokerSessionTimeoutMs": "2000", "brokerHeartbeatIntervalMs": "250"}
"""The membership settings of the second failover run: a shorter session, faster failover."""


@dataclass
class ClusterOptions:
    """How large the cluster runs are; ``enabled`` False leaves them out."""

    enabled: bool = True
    sizes: list[int] = field(default_factory=lambda: [1, 2, 3])
    partitions: int = 12
    records: int = 200_000
    size: int = 1024
    repeat: int = 3
    idle_seconds: float = 10.0
    failover_brokers: int = 3
    failover_partitions: int = 6
    kills: int = 10
    fast_membership: dict[str, str] = field(default_factory=lambda: dict(FAST_MEMBERSHIP))


QUICK = ClusterOptions(sizes=[1, 3], partitions=6, records=3_000, repeat=1, idle_seconds=1.0,
                       kills=1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The cluster rows' flags."""
    parser.add_argument("--no-cluster", action="store_true",
                        help="leave out the cluster rows (brokers on one PostgreSQL, failover)")
    parser.add_argument("--cluster-sizes", help="cluster rows: broker counts (1,2,3)")
    parser.add_argument("--cluster-partitions", type=int,
                        help="cluster rows: partitions the load is spread over (12)")
    parser.add_argument("--cluster-records", type=int,
                        help="cluster rows: records per trial, 1 KiB each (200000)")
    parser.add_argument("--kills", type=int,
                        help="failover: kill -9 of a partition owner this many times per "
                             "setting (10; 0 = no failover rows)")


def from_arguments(args: argparse.Namespace, quick: bool, repeat: int | None) -> ClusterOptions:
    """The cluster options of a run: the full or quick sizes, then the flags."""
    base = QUICK if quick else ClusterOptions()
    opts = dataclasses.replace(base, sizes=list(base.sizes),
                               fast_membership=dict(base.fast_membership))
    opts.enabled = not args.no_cluster
    if args.cluster_sizes:
        opts.sizes = [int(part) for part in args.cluster_sizes.split(",") if part.strip()]
    opts.partitions = args.cluster_partitions or opts.partitions
    opts.records = args.cluster_records or opts.records
    if args.kills is not None:
        opts.kills = max(0, args.kills)
    if repeat:
        opts.repeat = max(1, repeat)
    return opts
