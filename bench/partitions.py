"""``python -m bench.partitions``: 10,000 partitions (issue 21's row).

One broker (file storage, default settings). A topic of one partition and, in one
CreateTopics request, ``--topics`` topics of ``--per-topic`` partitions; while that
request runs, another connection sends ApiVersions one after another, and the longest
wait for an answer is the creation's stall of the event loop. Then trials alternate: 8
producers (``--producers``, confluent-kafka, one process each, acks=all, linger.ms=5)
send ``--records`` records of ``--size`` bytes in all, either to the single partition or
round-robin over every partition of the many topics; throughput (records over the span
from the first producer's start to the last one's end) and the broker's CPU seconds per
million records. Then the broker's peak RSS, its start-up time on those partitions after
a clean stop and after ``kill -9`` (recovery), and its RSS after each start. Targets
(issue 21): throughput at least 50% of the single partition's, peak RSS under 500 MB,
start-up under 10 s. Saved to ``partitions.json`` and ``partitions.md`` in ``--out``.

``python -m bench.partitions produce ...`` is one producer (run by the row).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from kafka.protocol.metadata import ApiVersionsRequest

from bench import procstats
from bench.admin import create_topic
from bench.brokers import Broker, EdgeBroker
from bench.idle_clients import frame
from bench.java_producer import JavaProducer
from bench.options import RESULTS
from bench.report import save_row
from bench.worker import Deliveries

MB = 1_000_000
SINGLE = "single"
PREFIX = "many-"
TARGET_RATIO = 0.5
TARGET_RSS_BYTES = 500 * MB
TARGET_START_S = 10.0


class RestartableBroker(EdgeBroker):
    """This broker, which can be started again on the same data directory."""

    def restart(self, kill: bool, timeout: float = 300.0) -> tuple[float, float]:
        """Stop it (SIGTERM and wait, or SIGKILL) and start it again; the seconds from the
        signal to the old process's exit, and from the new one's launch to its ready line."""
        proc = self.proc
        assert proc is not None
        stopping = time.perf_counter()
        if kill:
            proc.kill()
            proc.wait(30)
        else:
            Broker.stop(self, timeout)  # keeps the data directory
        stopped = time.perf_counter() - stopping
        ready = threading.Event()
        started = time.perf_counter()
        proc = self._spawn(self.command(), None)
        threading.Thread(target=self._drain, args=(proc, ready), daemon=True).start()
        self._wait_ready(ready, timeout)
        return stopped, time.perf_counter() - started


# -- one producer -----------------------------------------------------------------------

def produce(args: argparse.Namespace) -> dict[str, Any]:
    """Send ``count`` records round-robin over ``topics`` x ``per_topic`` partitions,
    starting at partition ``first`` (producers start at different ones)."""
    producer = Producer({"bootstrap.servers": args.bootstrap, "acks": "all",
                         "linger.ms": args.linger_ms, "client.id": "bench-partitions"})
    names = [args.topic] if args.topics == 0 else \
        [f"{args.topic}{i:04d}" for i in range(args.topics)]
    producer.list_topics(timeout=60)
    per_topic = max(args.per_topic, 1)
    total = len(names) * per_topic
    value = os.urandom(args.size)
    deliveries = Deliveries()
    started = time.time()
    for i in range(args.count):
        slot = (args.first + i) % total
        while True:
            try:
                producer.produce(names[slot // per_topic], value, partition=slot % per_topic,
                                 on_delivery=deliveries)
                break
            except BufferError:
                producer.poll(0.001)
        if i & 255 == 0:
            producer.poll(0)
    left = producer.flush(args.timeout)
    return {"records": deliveries.ok, "errors": deliveries.errors + left,
            "first_error": deliveries.first_error, "started": started, "ended": time.time()}


# -- the row ----------------------------------------------------------------------------

def _create_many(broker: EdgeBroker, args: argparse.Namespace) -> dict[str, float]:
    """Create the many topics in one request while another connection asks ApiVersions
    again and again; the creation's seconds and the longest wait for an answer."""
    ask = frame(ApiVersionsRequest[0](), 0, 1)
    stop = threading.Event()
    waits: list[float] = []

    def asker() -> None:
        with socket.create_connection(("127.0.0.1", broker.port), timeout=120) as sock:
            while not stop.is_set():
                sent = time.perf_counter()
                sock.sendall(ask)
                size = int.from_bytes(sock.recv(4, socket.MSG_WAITALL), "big")
                sock.recv(size, socket.MSG_WAITALL)
                waits.append(time.perf_counter() - sent)

    thread = threading.Thread(target=asker, daemon=True)
    thread.start()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "client.id": "bench-admin"})
    started = time.perf_counter()
    futures = admin.create_topics(
        [NewTopic(f"{PREFIX}{i:04d}", args.per_topic, 1) for i in range(args.topics)],
        operation_timeout=600, request_timeout=600)
    for future in futures.values():
        future.result(600)
    seconds = time.perf_counter() - started
    stop.set()
    thread.join(120)
    return {"create_seconds": seconds, "longest_wait_s": max(waits, default=0.0),
            "answered_meanwhile": float(len(waits))}


Command = Callable[[int, bool], list[str]]
"""The command line of producer ``n`` of a trial, to the many partitions or the single one."""


def _python_command(broker: EdgeBroker, args: argparse.Namespace) -> Command:
    """The confluent-kafka (librdkafka) producer of this module's ``produce`` mode."""
    def command(n: int, many: bool) -> list[str]:
        total = args.topics * args.per_topic if many else 1
        return [sys.executable, "-m", "bench.partitions", "produce", "--bootstrap",
                broker.bootstrap, "--topic", PREFIX if many else SINGLE,
                "--topics", str(args.topics if many else 0),
                "--per-topic", str(args.per_topic if many else 1),
                "--count", str(args.records // args.producers),
                "--first", str(n * total // args.producers), "--size", str(args.size),
                "--linger-ms", str(args.linger_ms)]
    return command


def _java_command(broker: EdgeBroker, args: argparse.Namespace,
                  program: JavaProducer) -> Command:
    """The kafka-clients producer (``bench/java/PartitionsProducer.java``)."""
    def command(n: int, many: bool) -> list[str]:
        total = args.topics * args.per_topic if many else 1
        return program.command(broker.bootstrap, PREFIX if many else SINGLE,
                               args.topics if many else 0, args.per_topic if many else 1,
                               args.records // args.producers, n * total // args.producers,
                               args.size, args.linger_ms)
    return command


def _trial(broker: EdgeBroker, args: argparse.Namespace, command: Command,
           many: bool) -> dict[str, float]:
    """One trial: the producers at once; records/s, and the CPU seconds per million
    records of the broker and of the producers."""
    clients0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    procs = [subprocess.Popen(command(n, many), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for n in range(args.producers)]
    cpu0 = broker.cpu_seconds()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=args.timeout)
        lines = out.strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"a producer exited {proc.returncode}:\n{err[-4000:]}")
        results.append(json.loads(lines[-1]))
    cpu = broker.cpu_seconds() - cpu0
    clients1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    client_cpu = (clients1.ru_utime + clients1.ru_stime
                  - clients0.ru_utime - clients0.ru_stime)
    records = sum(r["records"] for r in results)
    errors = sum(r["errors"] for r in results)
    span = max(r["ended"] for r in results) - min(r["started"] for r in results)
    return {"records": records, "errors": errors, "seconds": span,
            "records_per_s": records / span, "broker_cpu_s": cpu,
            "cpu_s_per_million": cpu / max(records, 1) * 1e6,
            "client_cpu_s_per_million": client_cpu / max(records, 1) * 1e6}


def _ratios(single: list[dict[str, float]], many: list[dict[str, float]]
            ) -> dict[str, Any]:
    """Trial by trial, round-robin over the single partition: throughput and CPU."""
    ratios = [m["records_per_s"] / s["records_per_s"] for s, m in zip(single, many, strict=True)]
    cpu = [m["cpu_s_per_million"] / s["cpu_s_per_million"]
           for s, m in zip(single, many, strict=True) if s["cpu_s_per_million"] > 0]
    return {"ratio": statistics.median(ratios), "ratios": ratios,
            "cpu_ratio": statistics.median(cpu) if cpu else None}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The row (see the module docstring)."""
    broker = RestartableBroker()
    broker.start(None, timeout=60)
    trials: dict[str, list[dict[str, float]]] = {
        "single": [], "many": [], "java_single": [], "java_many": []}
    with tempfile.TemporaryDirectory(prefix="bench-java-") as classes:
        java = JavaProducer.compile(Path(classes)) if args.java else None
        try:
            create_topic(broker.bootstrap, SINGLE, 1)
            creation = _create_many(broker, args)
            rss_created = procstats.rss_bytes(broker.pid)
            clients = [("", _python_command(broker, args))]
            if java is not None:
                clients.append(("java_", _java_command(broker, args, java)))
            for _ in range(args.repeat):
                for prefix, command in clients:
                    trials[prefix + "single"].append(_trial(broker, args, command, False))
                    trials[prefix + "many"].append(_trial(broker, args, command, True))
            broker.check_alive()
            peak = broker.peak_rss_bytes()
            clean_stop, clean_start = broker.restart(kill=False)
            rss_clean = procstats.rss_bytes(broker.pid)
            _, crash_start = broker.restart(kill=True)
            rss_crash = procstats.rss_bytes(broker.pid)
            peak = max(peak, broker.peak_rss_bytes())
        finally:
            broker.stop(300)
    librdkafka = _ratios(trials["single"], trials["many"])
    kafka_clients = _ratios(trials["java_single"], trials["java_many"]) if java else None
    start_s = max(clean_start, crash_start)
    targets = {"ratio": librdkafka["ratio"] >= TARGET_RATIO, "rss": peak < TARGET_RSS_BYTES,
               "start": start_s < TARGET_START_S}
    if kafka_clients is not None:
        targets["java_ratio"] = kafka_clients["ratio"] >= TARGET_RATIO
    return {
        "partitions": args.topics * args.per_topic, "creation": creation,
        "rss_after_creation_bytes": rss_created, **trials, **librdkafka,
        "java": kafka_clients, "peak_rss_bytes": peak, "clean_stop_s": clean_stop,
        "clean_start_s": clean_start, "crash_start_s": crash_start,
        "rss_after_clean_start_bytes": rss_clean, "rss_after_crash_start_bytes": rss_crash,
        "targets": targets, "options": {k: str(v) for k, v in vars(args).items()},
    }


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _produce_rows(result: dict[str, Any], client: str, prefix: str,
                  ratios: dict[str, Any], target: bool) -> list[str]:
    """The table rows of one client's trials."""
    count = result["partitions"]
    rows = []
    for kind, what in (("single", "1 partition"), ("many", f"round-robin over {count:,}")):
        trials = result[prefix + kind]
        rate = statistics.median(t["records_per_s"] for t in trials)
        cpu = statistics.median(t["cpu_s_per_million"] for t in trials)
        clients = statistics.median(t.get("client_cpu_s_per_million", 0.0) for t in trials)
        rows.append(f"| produce, {client}, {what} | {rate:,.0f} records/s, broker {cpu:.1f} "
                    f"CPU s per million (producers {clients:.0f}) |")
    rows.append(f"| **throughput ratio**, {client} (median of trial pairs) | "
                f"**{ratios['ratio']:.2f}** (range {min(ratios['ratios']):.2f}-"
                f"{max(ratios['ratios']):.2f}; target >= {TARGET_RATIO}: {_met(target)}); "
                f"broker CPU per record {_times(ratios['cpu_ratio'])} |")
    return rows


def _times(ratio: float | None) -> str:
    """A CPU ratio, or why there is none (a trial too short for /proc's CPU ticks)."""
    return "unreadable (too little CPU to measure)" if ratio is None else f"{ratio:.1f}x"


def render(result: dict[str, Any]) -> str:
    """The row as a Markdown table."""
    creation, targets = result["creation"], result["targets"]
    count = result["partitions"]
    rows = _produce_rows(result, "librdkafka (one partition per request)", "", result,
                         targets["ratio"])
    if result.get("java") is not None:
        rows += _produce_rows(result, "Java kafka-clients (many partitions per request)",
                              "java_", result["java"], targets["java_ratio"])
    stop = result.get("clean_stop_s")
    return "\n".join([
        f"### {count:,} partitions",
        "",
        "| measure | value |",
        "|---|---|",
        f"| CreateTopics of {count:,} partitions | {creation['create_seconds']:.1f} s; another "
        f"connection's longest wait {creation['longest_wait_s'] * 1e3:.0f} ms "
        f"({creation['answered_meanwhile']:.0f} answered meanwhile) |",
        *rows,
        f"| **peak RSS** | **{result['peak_rss_bytes'] / MB:.0f} MB** (target < "
        f"{TARGET_RSS_BYTES / MB:.0f} MB: {_met(targets['rss'])}) |",
        *([] if stop is None else
          [f"| clean stop (SIGTERM to exit) after writing to every partition | {stop:.1f} s |"]),
        f"| **start-up** after a clean stop / after kill -9 | **{result['clean_start_s']:.1f} "
        f"s / {result['crash_start_s']:.1f} s** (target < {TARGET_START_S:.0f} s: "
        f"{_met(targets['start'])}); RSS then {result['rss_after_clean_start_bytes'] / MB:.0f}"
        f" / {result['rss_after_crash_start_bytes'] / MB:.0f} MB |",
        "",
    ])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.partitions")
    parser.add_argument("mode", nargs="?", choices=("row", "produce"), default="row")
    parser.add_argument("--topics", type=int, default=1_000)
    parser.add_argument("--per-topic", type=int, default=10)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--records", type=int, default=400_000, help="records per trial")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--linger-ms", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=2, help="trials of each kind")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--no-java", dest="java", action="store_false",
                        help="leave out the Java (kafka-clients) producers' trials")
    parser.add_argument("--quick", action="store_true",
                        help="20 topics x 5, 2 producers, 4,000 records (the smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    # one producer's options
    parser.add_argument("--bootstrap", default="")
    parser.add_argument("--topic", default=SINGLE)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--first", type=int, default=0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.mode == "produce":
        print(json.dumps(produce(args)), flush=True)
        return 0
    if args.quick:
        args.topics, args.per_topic, args.producers, args.records, args.repeat = 20, 5, 2, 4000, 1
    result = run(args)
    text = render(result)
    print(text)
    save_row(args.out, "partitions", result, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
