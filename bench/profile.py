"""``python -m bench.profile``: py-spy on this broker while the benchmark's load runs.

Starts this broker as the benchmark does (pinned, durable defaults), runs the produce
load (or, with ``--load consume``, reads a filled topic over and over) for ``--seconds``
and samples the broker with ``py-spy record --format raw``; prints and saves the hottest
functions (self and total shares) as ``bench/results/profile-<load>[-idle].txt``.
``--idle`` counts waiting threads too (wall-clock view), ``--native`` adds C frames,
``--gil`` keeps only the samples of the thread holding the GIL,
``--svg`` also records a flame graph in a second pass under the same load.
``--postgres`` runs the broker on ``postgres://`` (a throwaway server, as the PostgreSQL
rows start it) instead of files; ``--partitions`` spreads the load over that many.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.admin import create_topic
from bench.brokers import EdgeBroker
from bench.options import RESULTS
from bench.pinning import inherited_affinity, pin_self, plan_cpus
from bench.stacks import parse, render
from edge.local_postgres import LocalPostgres


def py_spy() -> str:
    """The py-spy executable next to this Python, or on ``PATH``."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if not found:
        raise SystemExit("py-spy is not installed: pip install py-spy (the bench extra)")
    return found


def _worker(broker: EdgeBroker, topic: str, args: argparse.Namespace, mode: str,
            *extra: str) -> list[str]:
    return [sys.executable, "-m", "bench.worker", mode, "--bootstrap", broker.bootstrap,
            "--topic", topic, "--size", str(args.size), "--linger-ms", str(args.linger_ms),
            "--acks", "all", "--partitions", str(args.partitions), *extra]


def _load(broker: EdgeBroker, topic: str, args: argparse.Namespace) -> subprocess.Popen[str]:
    if args.load == "produce":
        command = _worker(broker, topic, args, "produce", "--seconds", str(args.seconds))
    else:  # read the topic again and again until the time is up
        once = " ".join(_worker(broker, topic, args, "consume", "--count", str(args.count)))
        command = ["bash", "-c", f"end=$((SECONDS+{int(args.seconds)})); "
                                 f"while [ $SECONDS -lt $end ]; do {once}; done"]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def fill(broker: EdgeBroker, topic: str, args: argparse.Namespace) -> None:
    """Before a consume profile: produce the records it reads."""
    subprocess.run(_worker(broker, topic, args, "produce", "--count", str(args.count)),
                   check=True, stdout=subprocess.DEVNULL)


def record(broker: EdgeBroker, topic: str, args: argparse.Namespace, fmt: str,
           output: Path) -> str:
    """One py-spy recording under the load; returns the load's JSON line(s)."""
    spy = [py_spy(), "record", "--pid", str(broker.pid), "--rate", str(args.rate),
           "--duration", str(int(args.seconds)), "--format", fmt, "--output", str(output)]
    # Native stacks need the process paused while sampled; Python-only ones do not.
    spy += ["--native"] if args.native else ["--nonblocking"]
    spy += ["--idle"] if args.idle else []
    spy += ["--gil"] if args.gil else []
    load = _load(broker, topic, args)
    spy_out = subprocess.run(spy, capture_output=True, text=True, check=False)
    stdout, _ = load.communicate(timeout=args.seconds + 120)
    if spy_out.returncode != 0:
        raise SystemExit(f"py-spy failed:\n{spy_out.stderr}")
    return stdout.strip()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load", choices=("produce", "consume"), default="produce",
                        help="what the broker serves while sampled")
    parser.add_argument("--count", type=int, default=300_000,
                        help="consume: records produced first and read back each round")
    parser.add_argument("--seconds", type=float, default=20.0, help="load and sampling time")
    parser.add_argument("--size", type=int, default=1024, help="record bytes")
    parser.add_argument("--linger-ms", type=float, default=5.0)
    parser.add_argument("--rate", type=int, default=250, help="samples per second")
    parser.add_argument("--idle", action="store_true", help="sample waiting threads too")
    parser.add_argument("--native", action="store_true", help="include C frames")
    parser.add_argument("--gil", action="store_true",
                        help="only samples of the thread holding the GIL (the event loop's "
                             "Python work, not the worker threads')")
    parser.add_argument("--top", type=int, default=15, help="rows per table")
    parser.add_argument("--svg", type=Path, help="also write a flame graph here")
    parser.add_argument("--raw", type=Path, help="keep the collapsed stacks here")
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="where profile.txt goes (bench/results)")
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--postgres", action="store_true",
                        help="the broker on postgres:// (a throwaway server) instead of files")
    parser.add_argument("--partitions", type=int, default=1,
                        help="partitions of the topic, the load spread over them")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Profile, print the summary, save it as ``profile.txt``."""
    args = _parser().parse_args(argv)
    cpus = plan_cpus(not args.no_pin)
    pin_self(cpus.load)
    server = None
    if args.postgres:  # on every CPU, as the PostgreSQL rows start it
        with inherited_affinity(frozenset(range(os.cpu_count() or 1))):
            server = LocalPostgres.running()
    broker = EdgeBroker({} if server is None else {"storageUrl": server.new_database_url()})
    try:
        broker.start(cpus.broker)
        topic = "bench-profile"
        create_topic(broker.bootstrap, topic, args.partitions)
        if args.load == "consume":
            fill(broker, topic, args)
        with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
            raw = args.raw or Path(tmp) / "stacks.txt"
            load = record(broker, topic, args, "raw", raw)
            summary = render(parse(raw.read_text(encoding="utf-8")), args.top)
        if args.svg:
            record(broker, topic, args, "flamegraph", args.svg)
    finally:
        broker.stop()
        if server is not None:
            server.discard()
    mode = "wall clock (--idle)" if args.idle else "on CPU"
    mode += ", GIL holder only" if args.gil else ""
    engine = "postgres://" if server is not None else "files"
    text = (f"py-spy, {mode}, {args.seconds:g} s of {args.load} load on {engine}, "
            f"{args.partitions} partition(s): {args.size} B records, "
            f"acks=all, linger.ms={args.linger_ms:g}; {cpus.describe()}\n"
            f"load: {load}\n{summary}\n")
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    name = (f"profile-{args.load}{'-postgres' if server is not None else ''}"
            f"{'-idle' if args.idle else ''}.txt")
    (args.out / name).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
