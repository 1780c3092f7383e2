"""Load generators: one librdkafka client per process (confluent-kafka, or the C tool
``rdkafka_performance`` run by this process), one JSON line out.

``python -m bench.worker produce|consume|latency|cproduce|cconsume --bootstrap HOST:PORT
--topic T ...``

- ``produce``: send ``--count`` records (or for ``--seconds``) as fast as the producer
  takes them, spread round-robin over ``--partitions`` (keyed ``key-0`` ... with
  ``--keys N``); time = first produce() to the last delivery report.
- ``consume``: read ``--count`` records from the beginning of every partition (assigned,
  no group); time = first poll to the last record.
- ``latency``: send at a fixed ``--rate`` for ``--seconds`` (paced in 1 ms ticks); each
  record's latency is from its produce() call to its delivery report; the first
  ``--warmup`` seconds are left out (``window_unix``: the measured seconds, epoch time).
- ``cproduce`` / ``cconsume``: the same as produce and consume, by librdkafka's C tool
  ``rdkafka_performance`` (``--binary``; see ``bench/cclient.py``): cproduce on partition 0,
  cconsume on partitions 0 to ``--partitions`` - 1 (one client reading them all).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)

from bench.stats import summarize_ms

_BATCH = 10_000
_TICK_S = 0.001
FETCH_QUEUE_BACKOFF_MS = 10
"""Consumers' ``fetch.queue.backoff.ms``: how long librdkafka waits before fetching again
once 100,000 records (``queued.min.messages``) wait in its queue. Its default (1000)
pauses the run for up to a second; 0 makes its fetcher thread busy-loop on the load
generator's CPU while the queue is full, which it is more often the faster the broker
answers. 10 ms is less than the consumers here need to drain that queue (over 35 ms)."""


def producer_config(args: argparse.Namespace) -> dict[str, Any]:
    """The same producer settings for every broker: acks, linger, nothing else changed."""
    return {
        "bootstrap.servers": args.bootstrap,
        "acks": args.acks,
        "linger.ms": args.linger_ms,
        "client.id": "bench-producer",
        "compression.type": args.compression,
        **extra_config(args),
    }


def extra_config(args: argparse.Namespace) -> dict[str, str]:
    """The ``--config KEY=VALUE`` settings (security ones: the TLS and login rows)."""
    return dict(item.split("=", 1) for item in args.config)


def record_value(args: argparse.Namespace) -> bytes:
    """The value every record carries: random bytes, or with ``--values text`` text that
    codecs shrink about as they shrink JSON (words drawn from a small vocabulary)."""
    if args.values == "random":
        return os.urandom(args.size)
    words = [os.urandom(3).hex() for _ in range(64)]
    picks = os.urandom(args.size)
    return " ".join(words[pick % 64] for pick in picks).encode()[:args.size]


class Deliveries:
    """Delivery-report counter (the callback of every record in throughput runs)."""

    def __init__(self) -> None:
        self.ok = 0
        self.errors = 0
        self.first_error = ""

    def __call__(self, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            self.ok += 1
        else:
            self.errors += 1
            self.first_error = self.first_error or str(err)


def _warm_up(producer: Producer, topic: str) -> None:
    """Fetch metadata and open the connection before the clock starts."""
    producer.list_topics(topic, timeout=20)


def _send(producer: Producer, topic: str, value: bytes, partition: int, callback: Any,
          key: bytes | None = None) -> None:
    while True:
        try:
            producer.produce(topic, value, key=key, partition=partition, on_delivery=callback)
            return
        except BufferError:
            producer.poll(0.001)


def run_produce(args: argparse.Namespace) -> dict[str, Any]:
    """Throughput: as many records as the producer accepts."""
    producer = Producer(producer_config(args))
    _warm_up(producer, args.topic)
    value = record_value(args)
    deliveries = Deliveries()
    cpu0, start = time.process_time(), time.perf_counter()
    stop_at = start + args.seconds if args.seconds else float("inf")
    sent = 0
    keys = [f"key-{i}".encode() for i in range(args.keys)]
    while (sent < args.count or args.seconds) and time.perf_counter() < stop_at:
        _send(producer, args.topic, value, sent % args.partitions, deliveries,
              keys[sent % len(keys)] if keys else None)
        sent += 1
        if sent & 255 == 0:
            producer.poll(0)
    left = producer.flush(args.timeout)
    elapsed = time.perf_counter() - start
    return {
        "records": deliveries.ok, "bytes": deliveries.ok * args.size, "sent": sent,
        "seconds": elapsed, "errors": deliveries.errors + left,
        "first_error": deliveries.first_error, "client_cpu_s": time.process_time() - cpu0,
    }


def run_consume(args: argparse.Namespace) -> dict[str, Any]:
    """Read ``count`` records from the beginning."""
    config: dict[str, Any] = {
        "bootstrap.servers": args.bootstrap, "group.id": "bench-consumer",
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "client.id": "bench-consumer",
        "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS, **extra_config(args),
    }
    if args.partition_fetch_bytes > 0:
        config["max.partition.fetch.bytes"] = args.partition_fetch_bytes
    consumer = Consumer(config)
    metadata = consumer.list_topics(args.topic, timeout=20)
    partitions = sorted(metadata.topics[args.topic].partitions)
    consumer.assign([TopicPartition(args.topic, p, OFFSET_BEGINNING) for p in partitions])
    got = size = errors = 0
    first_error = ""
    cpu0, start = time.process_time(), time.perf_counter()
    last = start
    deadline = start + args.timeout
    while got < args.count and time.perf_counter() < deadline:
        messages = consumer.consume(min(_BATCH, args.count - got), 0.5)
        for message in messages:
            error = message.error()
            if error is not None:
                errors += 1
                first_error = first_error or str(error)
                continue
            got += 1
            size += len(message.value() or b"")
        if messages:
            last = time.perf_counter()
    cpu = time.process_time() - cpu0
    consumer.close()
    return {"records": got, "bytes": size, "seconds": last - start, "errors": errors,
            "first_error": first_error, "client_cpu_s": cpu,
            "missing": max(0, args.count - got)}


class RoundTrips:
    """librdkafka's produce request round-trip times (``brokers[].rtt``), per 1 s window.

    The delivery latency includes the time a record lingers in the producer; the round
    trip is the request alone: sent to the broker, answered. Windows that end before
    ``measure_from`` (warm-up) are left out.
    """

    def __init__(self) -> None:
        self.measure_from = float("inf")
        self.windows: list[dict[str, float]] = []

    def __call__(self, stats_json: str) -> None:
        if time.perf_counter() < self.measure_from + 1.0:
            return
        for broker in json.loads(stats_json).get("brokers", {}).values():
            rtt = broker.get("rtt", {})
            if broker.get("nodeid", -1) >= 0 and rtt.get("cnt", 0) > 0:
                self.windows.append({k: float(rtt[k]) / 1000 for k in ("p50", "p99", "max")})

    def summary(self) -> dict[str, float]:
        """Median of the windows' p50, worst of their p99 and the maximum, in ms."""
        if not self.windows:
            return {}
        p50s = sorted(w["p50"] for w in self.windows)
        return {"rtt_p50_ms": p50s[len(p50s) // 2],
                "rtt_p99_ms": max(w["p99"] for w in self.windows),
                "rtt_max_ms": max(w["max"] for w in self.windows),
                "rtt_windows": float(len(self.windows))}


def run_latency(args: argparse.Namespace) -> dict[str, Any]:
    """Fixed-rate produce; latency of each record from produce() to its delivery report."""
    round_trips = RoundTrips()
    producer = Producer({**producer_config(args), "statistics.interval.ms": 1000,
                         "stats_cb": round_trips})
    _warm_up(producer, args.topic)
    value = os.urandom(args.size)
    samples: list[float] = []
    errors = [0]
    clock = time.perf_counter
    start = clock()
    measure_from = round_trips.measure_from = start + args.warmup
    stop_at = start + args.warmup + args.seconds

    def report(err: KafkaError | None, _msg: Message, sent_at: float) -> None:
        if err is not None:
            errors[0] += 1
        elif sent_at >= measure_from:
            samples.append(clock() - sent_at)

    sent = 0
    cpu0 = time.process_time()
    while (now := clock()) < stop_at:
        due = int((now - start) * args.rate)
        while sent < due:
            sent_at = clock()
            _send(producer, args.topic, value, sent % args.partitions,
                  lambda err, msg, t=sent_at: report(err, msg, t))
            sent += 1
        # Serve delivery reports and sleep a tick (1 ms): the records due meanwhile go out
        # together next time round, without a busy loop on the load generators' CPU.
        producer.poll(_TICK_S)
    left = producer.flush(args.timeout)
    measured_seconds = stop_at - measure_from
    unix_offset = time.time() - clock()
    return {
        "window_unix": [measure_from + unix_offset, stop_at + unix_offset],
        "sent": sent, "measured": len(samples), "errors": errors[0] + left,
        "target_rate": args.rate, "achieved_rate": len(samples) / measured_seconds,
        "seconds": measured_seconds, "client_cpu_s": time.process_time() - cpu0,
        **summarize_ms(samples), **round_trips.summary(),
    }


def _table(stdout: str) -> dict[str, str]:
    """The last row of ``rdkafka_performance -u`` output (its summary), by column name."""
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in stdout.splitlines() if line.startswith("|")]
    headers = [row for row in rows if row and row[0] == "elapsed"]
    values = [row for row in rows if row and row[0] != "elapsed"]
    if not headers or not values:
        raise RuntimeError(f"no summary in rdkafka_performance's output:\n{stdout[-2000:]}")
    return dict(zip(headers[-1], values[-1], strict=False))


def run_c(args: argparse.Namespace) -> dict[str, Any]:
    """``rdkafka_performance`` (librdkafka's C load generator) as producer or consumer.

    Producer: ``count`` records to partition 0, time = first record to last delivery
    report. Consumer: ``count`` records in all of partitions 0 to ``partitions`` - 1 from
    the beginning, by one client (the tool's ``-p`` given once per partition: one queue
    fed by every partition's fetches), time = first record to last over all of them.
    Both as the tool measures them; its CPU time comes from ``wait4``.
    """
    producing = args.mode == "cproduce"
    command = [args.binary, "-P" if producing else "-C", "-t", args.topic]
    for partition in range(1 if producing else max(1, args.partitions)):
        command += ["-p", str(partition)]
    command += ["-b", args.bootstrap, "-c", str(args.count), "-u"]
    if producing:
        command += ["-s", str(args.size), "-X", f"acks={args.acks}",
                    "-X", f"linger.ms={args.linger_ms:g}"]
    else:
        command += ["-o", "beginning", "-X", f"fetch.queue.backoff.ms={FETCH_QUEUE_BACKOFF_MS}"]
    for item in args.config:
        command += ["-X", item]
    own0 = time.process_time()
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as child:
        try:
            stdout, stderr = child.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            stdout, stderr = child.communicate()
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    row = _table(stdout)
    records = int(row["dr"] if producing else row["msgs"])
    # tx_err counts produce() calls refused for a full queue (retried): backpressure only
    errors = int(row["dr_err"] if producing else row["rx_err"])
    if child.returncode != 0:
        errors = max(errors, 1)
    size = records * args.size if producing else int(row["bytes"])
    # The tool's elapsed column is in whole ms; its rate column (records * 10^6 / its
    # elapsed microseconds) gives the time more finely.
    rate = int(row["dr_m/s"] if producing else row["m/s"])
    seconds = records / rate if rate > 0 else int(row["elapsed"]) / 1000
    return {"records": records, "bytes": size, "seconds": max(seconds, 1e-3),
            "errors": errors,
            "first_error": stderr.strip()[-500:] if errors else "", "client_cpu_s": cpu,
            "process_cpu_s": cpu + time.process_time() - own0,
            "missing": max(0, args.count - records)}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.worker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("produce", "consume", "latency", "cproduce", "cconsume"))
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--size", type=int, default=1024, help="record value bytes")
    parser.add_argument("--count", type=int, default=10_000, help="records")
    parser.add_argument("--seconds", type=float, default=0.0,
                        help="produce: run this long instead of --count; latency: measure time")
    parser.add_argument("--partitions", type=int, default=1,
                        help="produce: spread records over these; cconsume: read these")
    parser.add_argument("--acks", default="all")
    parser.add_argument("--linger-ms", type=float, default=5.0)
    parser.add_argument("--rate", type=float, default=20_000.0, help="latency: records/s")
    parser.add_argument("--warmup", type=float, default=1.0, help="latency: seconds left out")
    parser.add_argument("--timeout", type=float, default=120.0, help="give up after (s)")
    parser.add_argument("--binary", default="rdkafka_performance",
                        help="cproduce/cconsume: the rdkafka_performance to run")
    parser.add_argument("--partition-fetch-bytes", type=int, default=0,
                        help="consume: max.partition.fetch.bytes (0 = librdkafka's default)")
    parser.add_argument("--compression", default="none",
                        help="produce: the producer's compression.type")
    parser.add_argument("--values", choices=("random", "text"), default="random",
                        help="produce: random bytes, or text that codecs can shrink")
    parser.add_argument("--keys", type=int, default=0,
                        help="produce: cycle through this many keys (0: no key)")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="a further client setting (repeatable), e.g. security.protocol")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one load generator and print its result as one JSON line."""
    args = _parser().parse_args(argv)
    runners = {"produce": run_produce, "consume": run_consume, "latency": run_latency,
               "cproduce": run_c, "cconsume": run_c}
    result = runners[args.mode](args)
    times = os.times()
    result["process_cpu_s"] = times.user + times.system  # start-up and shutdown included
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
