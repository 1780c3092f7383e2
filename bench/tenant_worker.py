"""One tenant of the mixed-tenants row: ``python -m bench.tenant_worker``.

One process drives a tenant's ``--producers`` producers and ``--consumers`` consumers
(confluent-kafka, one connection each, all logged in with the ``--config`` settings). The
consumers are assigned the topic's partitions round-robin from the beginning (no group);
producer ``i`` writes to partition ``i``. Each producer sends ``--rate`` records/s of
``--size`` bytes, paced in ticks of up to 10 ms from one thread, from start-up until ``--end``
(epoch seconds); each record carries its send time (epoch, first 8 bytes). Records sent
in [``--begin``, ``--end``) are measured: delivery latency (produce() to delivery
report, librdkafka's ``Message.latency()``) and end to end (send time to the consumer's
poll returning it). After ``--end`` the producers flush and the consumers read until every
measured record arrived or ``--timeout``. One JSON line out, latencies in ms, sorted.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import threading
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

_STAMP = struct.Struct("!d")
_MAX_TICK_S = 0.01
"""The pacing loop's longest sleep. One 1 ms tick per process, as ``bench.worker`` paces,
is 20,000 wake-ups a second for 20 tenants: enough to starve the load generators' one CPU
(delivery p99 of a minute in the first full run). At most one tick per record, at most
10 ms: records due meanwhile go out together, each stamped when it is sent."""


class Window:
    """The measured send times and what arrived of them."""

    def __init__(self, begin: float, end: float) -> None:
        self.begin = begin
        self.end = end
        self.lock = threading.Lock()
        self.delivery_s: list[float] = []
        self.e2e_s: list[float] = []
        self.errors = 0
        self.first_error = ""

    def measured(self, value: bytes | None) -> float | None:
        """The send time of a measured record, else ``None``."""
        if value is None or len(value) < _STAMP.size:
            return None
        sent: float = _STAMP.unpack_from(value)[0]
        return sent if self.begin <= sent < self.end else None

    def on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        """Delivery report of every record (called from ``poll`` in its producer's
        report thread, or from ``flush`` at the end)."""
        if err is not None:
            with self.lock:
                self.errors += 1
                self.first_error = self.first_error or str(err)
            return
        latency = msg.latency()
        if latency is not None and self.measured(msg.value()) is not None:
            with self.lock:
                self.delivery_s.append(latency)


def _consume(consumer: Consumer, window: Window, stop: threading.Event) -> None:
    # poll, not consume(n, timeout): that waits for n records or the timeout, which
    # would add its own wait to the end-to-end latency.
    while not stop.is_set():
        msg = consumer.poll(0.1)
        if msg is None or msg.error() is not None:
            continue
        now = time.time()
        sent = window.measured(msg.value())
        if sent is not None:
            with window.lock:
                window.e2e_s.append(now - sent)


def _serve_reports(producer: Producer, stop: threading.Event) -> None:
    # Its own thread per producer: librdkafka's Message.latency() is measured when the
    # report is served (poll), so reports served once per pacing tick would add up to a
    # tick to every delivery latency (10 ms steps in the first runs).
    while not stop.is_set():
        producer.poll(0.05)


def _send(producer: Producer, topic: str, partition: int, value: bytearray,
          window: Window) -> float | None:
    """Send one record stamped now: its stamp, or ``None`` when the queue is full."""
    stamp = time.time()
    _STAMP.pack_into(value, 0, stamp)
    try:
        producer.produce(topic, bytes(value), partition=partition,
                         on_delivery=window.on_delivery)
    except BufferError:
        return None
    return stamp


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the clients, produce at the rate until ``--end``, drain, summarize."""
    config = dict(item.split("=", 1) for item in args.config)
    config["bootstrap.servers"] = args.bootstrap
    window = Window(args.begin, args.end)
    producers = [Producer({**config, "acks": "all", "linger.ms": args.linger_ms,
                           "client.id": f"{args.name}-p{i}"}) for i in range(args.producers)]
    consumers = [Consumer({**config, "group.id": f"{args.name}-mixed",
                           "enable.auto.commit": False, "client.id": f"{args.name}-c{i}"})
                 for i in range(args.consumers)]
    for producer in producers:
        producer.list_topics(args.topic, timeout=args.timeout)
    for index, consumer in enumerate(consumers):
        consumer.assign([TopicPartition(args.topic, p, OFFSET_BEGINNING)
                         for p in range(index, args.partitions, args.consumers)])
    stop = threading.Event()
    threads = [threading.Thread(target=_consume, args=(c, window, stop), daemon=True)
               for c in consumers]
    reporting = threading.Event()
    reporters = [threading.Thread(target=_serve_reports, args=(p, reporting), daemon=True)
                 for p in producers]
    for thread in threads + reporters:
        thread.start()
    value = bytearray(os.urandom(args.size))
    cpu0 = time.process_time()
    ready = start = time.time()
    sent = [0] * len(producers)
    measured_sent = 0
    tick = min(_MAX_TICK_S, 1.0 / max(args.rate, 1.0))
    while (now := time.time()) < args.end:
        due = int((now - start) * args.rate)
        for index, producer in enumerate(producers):
            while sent[index] < due:
                stamp = _send(producer, args.topic, index % args.partitions, value, window)
                if stamp is None:
                    break
                sent[index] += 1
                measured_sent += args.begin <= stamp < args.end
        time.sleep(tick)
    reporting.set()
    for thread in reporters:
        thread.join(10)
    left = sum(producer.flush(args.timeout) for producer in producers)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        with window.lock:
            if len(window.e2e_s) >= measured_sent:
                break
        time.sleep(0.05)
    stop.set()
    for thread in threads:
        thread.join(10)
    for consumer in consumers:
        consumer.close()
    return {
        "name": args.name, "ready_unix": ready, "late_s": max(0.0, ready - args.begin),
        "sent": sum(sent), "measured_sent": measured_sent,
        "delivered": len(window.delivery_s), "received": len(window.e2e_s),
        "errors": window.errors + left, "first_error": window.first_error,
        "seconds": args.end - args.begin, "client_cpu_s": time.process_time() - cpu0,
        "delivery_ms": sorted(round(s * 1e3, 3) for s in window.delivery_s),
        "e2e_ms": sorted(round(s * 1e3, 3) for s in window.e2e_s),
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.tenant_worker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True, help="the tenant (client ids, group id)")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--producers", type=int, default=5)
    parser.add_argument("--consumers", type=int, default=5)
    parser.add_argument("--rate", type=float, required=True, help="records/s per producer")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--linger-ms", type=float, default=5.0)
    parser.add_argument("--begin", type=float, required=True, help="epoch s: measure from")
    parser.add_argument("--end", type=float, required=True, help="epoch s: stop producing")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one tenant and print its result as one JSON line."""
    result = run(_parser().parse_args(argv))
    times = os.times()
    result["process_cpu_s"] = times.user + times.system
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
