"""A chaos soak of the cluster: ``python -m bench.chaos --minutes N --seed S``.

A throwaway PostgreSQL and three brokers on it (short broker sessions, so that faults
move partitions and coordinators), two topics, the load of ``bench/chaos_load.py``
(idempotent producer, transactional consume-transform-produce, a group of two), and the
faults of ``bench/chaos_faults.py`` every few seconds for N minutes, chosen by seed S.
Then the faults stop, the load stops (the transform first catches up with its input) and
``bench/chaos_check.py`` checks what was promised. The summary (stdout, and
``summary.json`` in the run's directory beside each broker's log) gives the faults by
kind, the records acknowledged and every violation with the fault just before it. Exit
status 1 if there was a violation.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import IsolationLevel
from confluent_kafka.admin import AdminClient

from bench.admin import create_topic
from bench.chaos_check import (
    Violation,
    check_input,
    check_offsets,
    check_output,
    check_stable,
    latest,
)
from bench.chaos_cluster import START_TIMEOUT_S, ChaosCluster
from bench.chaos_faults import KINDS, Fault, FaultPlan, Injector
from bench.chaos_load import (
    INPUT_GROUP,
    TRANSACTION_TIMEOUT_MS,
    TRANSFORM_GROUP,
    Clock,
    GroupCommit,
    GroupLoad,
    IdempotentLoad,
    LoadThread,
    OffsetWatch,
    TransformLoad,
    committed_offsets,
)
from bench.cluster_db import running_postgres
from tests.cluster_helpers import FAST_FAILOVER
from tests.txn_helpers import FAST_TXN

SOURCE, SINK = "chaos-in", "chaos-out"
DRAIN_S = 180.0
"""How long the transform may take to catch up with its input once the faults stop."""


@dataclass(frozen=True)
class ChaosOptions:
    """What one run does."""

    minutes: float
    seed: int
    out: Path
    brokers: int = 3
    partitions: int = 6
    rate: int = 300
    gap_s: tuple[float, float] = (3.0, 8.0)
    kinds: tuple[str, ...] = KINDS
    client_debug: str = ""


def parse(argv: Sequence[str] | None = None) -> ChaosOptions:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="of faults (default 5)")
    parser.add_argument("--seed", type=int, default=1, help="of the faults' choices")
    parser.add_argument("--out", type=Path, default=None,
                        help="the run's directory: broker logs, summary.json (default: a new "
                             "one under the temporary directory)")
    parser.add_argument("--rate", type=int, default=300,
                        help="records/s of the idempotent producer (default 300)")
    parser.add_argument("--gap", type=float, nargs=2, default=(3.0, 8.0), metavar=("MIN", "MAX"),
                        help="seconds between faults (default 3 8)")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"faults to choose from (default {','.join(KINDS)})")
    parser.add_argument("--client-debug", default="", metavar="CONTEXTS",
                        help="librdkafka debug contexts of the transform's producer, its "
                             "lines on stderr (e.g. eos,protocol,broker)")
    args = parser.parse_args(argv)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = set(kinds) - set(KINDS)
    if unknown or not kinds:
        parser.error(f"unknown fault kinds {sorted(unknown)} (of {', '.join(KINDS)})")
    out = args.out or Path(tempfile.mkdtemp(prefix=f"edge-chaos-{args.seed}-"))
    return ChaosOptions(args.minutes, args.seed, out, rate=args.rate,
                        gap_s=(args.gap[0], args.gap[1]), kinds=kinds,
                        client_debug=args.client_debug)


_BEGAN = time.monotonic()


def say(what: str) -> None:
    print(f"[chaos {time.monotonic() - _BEGAN:6.1f} s] {what}", file=sys.stderr, flush=True)


def around(faults: list[Fault], at: float | None) -> str:
    """The fault just before ``at`` (and the one after it), for a violation's line."""
    if at is None:
        return "seen at the end"
    before = [f for f in faults if f.started <= at]
    after = [f for f in faults if f.started > at]
    parts = [f"at {at:.1f} s", f"last fault before: {before[-1].label() if before else 'none'}"]
    if after:
        parts.append(f"next: {after[0].label()}")
    return "; ".join(parts)


def run(opts: ChaosOptions) -> dict[str, Any]:
    """One run, start to summary."""
    opts.out.mkdir(parents=True, exist_ok=True)
    settings = {**FAST_FAILOVER, **FAST_TXN}
    session_s = int(FAST_FAILOVER["brokerSessionTimeoutMs"]) / 1000
    with running_postgres() as server:
        cluster = ChaosCluster(server, opts.brokers, settings, opts.out)
        try:
            say(f"starting {opts.brokers} brokers; logs in {opts.out}")
            cluster.start(None, START_TIMEOUT_S)
            return _soak(opts, cluster, session_s)
        finally:
            say("stopping the brokers")
            cluster.stop()


def _soak(opts: ChaosOptions, cluster: ChaosCluster, session_s: float) -> dict[str, Any]:
    bootstrap = cluster.bootstrap
    for topic in (SOURCE, SINK):
        create_topic(bootstrap, topic, opts.partitions)
    clock = Clock(time.monotonic())
    producer = IdempotentLoad(clock, bootstrap, SOURCE, opts.partitions, opts.rate)
    transform = TransformLoad(clock, bootstrap, SOURCE, SINK, ports=cluster.ports,
                              debug=opts.client_debug)
    commits: list[GroupCommit] = []
    members = [GroupLoad(clock, bootstrap, SOURCE, m, commits) for m in range(2)]
    watch = OffsetWatch(clock, bootstrap, SOURCE, opts.partitions,
                        (INPUT_GROUP, TRANSFORM_GROUP))
    loads: list[LoadThread] = [producer, transform, *members, watch]
    for load in loads:
        load.journal = opts.out / f"{load.name}.notes"
        load.start()
    plan = FaultPlan(opts.seed, opts.gap_s, session_s, opts.kinds)
    injector = Injector(cluster, plan, clock.t0)
    say(f"{opts.minutes:g} min of faults (seed {opts.seed}, every {opts.gap_s[0]:g}-"
        f"{opts.gap_s[1]:g} s)")
    injector.start()
    time.sleep(opts.minutes * 60)
    say(f"faults stop ({len(plan.faults)} so far); waiting for the last one to end")
    injector.finish()
    cluster.wait_for_members(START_TIMEOUT_S)
    say("every broker up; stopping the load")
    producer.halt.set()
    producer.join(300)
    for member in members:
        member.halt.set()
        member.join(60)
    stopped_at = clock.now()
    transform.drain(latest(AdminClient({"bootstrap.servers": bootstrap}), SOURCE,
                           opts.partitions, IsolationLevel.READ_UNCOMMITTED))
    transform.join(DRAIN_S)
    transform.halt.set()
    transform.join(60)
    watch.halt.set()
    watch.join(30)
    say("checking")
    violations: list[Violation] = []
    if not transform.caught_up:
        violations.append(Violation("transform never caught up", -1, "-",
                                    f"{DRAIN_S:g} s after the input stopped", stopped_at))
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for topic in (SOURCE, SINK):
        violations += check_stable(admin, topic, opts.partitions,
                                   TRANSACTION_TIMEOUT_MS / 1000 + 10)
    found, inputs = check_input(bootstrap, SOURCE, opts.partitions, producer.acked,
                                set(producer.failed))
    violations += found
    found, outputs = check_output(bootstrap, SOURCE, SINK, opts.partitions, inputs,
                                  TRANSFORM_GROUP)
    violations += found
    final = committed_offsets(bootstrap, INPUT_GROUP, SOURCE, opts.partitions, stable=False)
    violations += check_offsets(watch.samples, commits, final, INPUT_GROUP)
    return {
        "seed": opts.seed, "minutes": opts.minutes, "out": str(opts.out),
        "faults": Counter(f.kind for f in plan.faults),
        "fault_list": [asdict(f) for f in plan.faults],
        "injector_error": repr(injector.error) if injector.error else None,
        "acked": len(producer.acked), "sent": producer.sent, "failed": len(producer.failed),
        "producers": producer.producers, "transactions": len(transform.commits),
        "transform_aborts": transform.aborts, "transform_rejoins": transform.rejoins,
        "transform_producers": transform.producers, "outputs": outputs,
        "group_commits": len(commits), "offset_samples": len(watch.samples),
        "crashed": {load.name: repr(load.crashed) for load in loads if load.crashed},
        "client_errors": {load.name: load.error_count for load in loads},
        "client_notes": {load.name: load.notes[:10] for load in loads if load.notes},
        "violations": [{**asdict(v), "around": around(plan.faults, v.at)} for v in violations],
    }


def summary_text(result: dict[str, Any]) -> str:
    """The printed summary."""
    faults = ", ".join(f"{kind} {count}" for kind, count in sorted(result["faults"].items()))
    lines = [f"chaos run, seed {result['seed']}, {result['minutes']:g} min: "
             f"{sum(result['faults'].values())} faults ({faults or 'none'})",
             f"idempotent producer: {result['acked']:,} records acknowledged of "
             f"{result['sent']:,} sent ({result['failed']} failed, "
             f"{result['producers']} producer(s))",
             f"transform: {result['transactions']:,} transactions committed, "
             f"{result['outputs']:,} outputs, {result['transform_aborts']} aborted, "
             f"{result['transform_rejoins']} consumer(s), "
             f"{result['transform_producers']} producer(s)",
             f"group: {result['group_commits']:,} commits acknowledged, "
             f"{result['offset_samples']:,} offset samples",
             "client errors (retried): " + ", ".join(
                 f"{name} {count}" for name, count in result["client_errors"].items())]
    if result["injector_error"]:
        lines.append(f"fault injector failed: {result['injector_error']}")
    for name, crash in result["crashed"].items():
        lines.append(f"load {name} crashed: {crash}")
    violations = result["violations"]
    lines.append(f"violations: {len(violations)}" if violations else "violations: none")
    for v in violations[:40]:
        where = f"partition {v['partition']}" if v["partition"] >= 0 else "-"
        lines.append(f"  {v['kind']}: {where}, offsets {v['offsets']}: {v['detail']} "
                     f"({v['around']})")
    lines.append(f"logs and summary.json in {result['out']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse(argv)
    result = run(opts)
    (opts.out / "summary.json").write_text(json.dumps(result, indent=1, default=str),
                                           encoding="utf-8")
    print(summary_text(result), flush=True)
    clean = not result["violations"] and not result["crashed"] and not result["injector_error"]
    return 0 if clean else 1


if __name__ == "__main__":
    raise SystemExit(main())
