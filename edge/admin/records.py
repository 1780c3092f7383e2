"""``admin produce`` and ``admin consume``: quick checks that records go in and come out.

``produce TOPIC [VALUE ...]`` writes each value (or each line of stdin when none is
given) and shows the partition and offset each got. ``consume TOPIC`` reads from the
start (or ``--offset``) of every partition up to the end offsets seen when it began, or
``--max-messages``, without a consumer group, so it commits nothing.
"""

from __future__ import annotations

import argparse
import sys
import time

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from edge.admin.connection import Clients
from edge.admin.errors import CallFailed, UsageError
from edge.admin.output import Report
from edge.admin.parsing import SubParsers


def add_parsers(groups: SubParsers) -> None:
    """The ``produce`` and ``consume`` verbs (groups of their own)."""
    produce = groups.add_parser("produce", help="write records (arguments or stdin lines)")
    produce.add_argument("topic")
    produce.add_argument("values", nargs="*", metavar="VALUE",
                         help="the values (give options before TOPIC); none: stdin lines")
    produce.add_argument("--key", help="the key of every record")
    produce.add_argument("--partition", type=int, help="write to this partition")
    produce.set_defaults(run=produce_records)
    consume = groups.add_parser("consume", help="read records up to the end offsets")
    consume.add_argument("topic")
    consume.add_argument("--partition", type=int, help="only this partition")
    consume.add_argument("--offset", type=int, default=0,
                         help="start at this offset in each partition (default 0; the "
                              "log start when older)")
    consume.add_argument("--max-messages", type=int, help="stop after this many")
    consume.set_defaults(run=consume_records)


def produce_records(args: argparse.Namespace, clients: Clients) -> Report:
    """Send every value with acks=all; the partition and offset of each."""
    values = list(args.values) or [line.rstrip("\n") for line in sys.stdin]
    key = None if args.key is None else args.key.encode()
    producer = KafkaProducer(**clients.settings.keywords(), acks="all", retries=3,
                             max_block_ms=clients.settings.timeout_ms)
    report = Report()
    table = report.table("records", "partition", "offset")
    try:
        futures = [producer.send(args.topic, value.encode(), key=key,
                                 partition=args.partition) for value in values]
        for future in futures:
            metadata = future.get(timeout=clients.settings.timeout_ms / 1000)
            table.add(int(metadata.partition), int(metadata.offset))
    finally:
        producer.close(timeout=5)
    return report


def consume_records(args: argparse.Namespace, clients: Clients) -> Report:
    """Read to the end offsets found at the start (or ``--max-messages``)."""
    if args.max_messages is not None and args.max_messages < 1:
        raise UsageError("--max-messages must be at least 1")
    consumer = KafkaConsumer(**clients.settings.keywords(), enable_auto_commit=False,
                             auto_offset_reset="earliest", group_id=None)
    report = Report()
    table = report.table("records", "partition", "offset", "key", "value")
    try:
        partitions = consumer.partitions_for_topic(args.topic)
        if not partitions:
            raise CallFailed(f"UNKNOWN_TOPIC_OR_PARTITION: topic {args.topic} not found")
        chosen = [TopicPartition(args.topic, p) for p in sorted(partitions)
                  if args.partition is None or p == args.partition]
        if not chosen:
            raise UsageError(f"topic {args.topic} has no partition {args.partition}")
        consumer.assign(chosen)
        ends: dict[TopicPartition, int] = consumer.end_offsets(chosen)
        starts: dict[TopicPartition, int] = consumer.beginning_offsets(chosen)
        for tp in chosen:
            consumer.seek(tp, max(args.offset, starts[tp]))
        left = {tp for tp in chosen if consumer.position(tp) < ends[tp]}
        deadline = time.monotonic() + clients.settings.timeout_ms / 1000
        count = 0
        while left and time.monotonic() < deadline:
            for tp, messages in consumer.poll(timeout_ms=500).items():
                for message in messages:
                    if message.offset >= ends[tp] or count == args.max_messages:
                        continue
                    table.add(tp.partition, int(message.offset), _text(message.key),
                              _text(message.value))
                    count += 1
                if consumer.position(tp) >= ends[tp]:
                    left.discard(tp)
            if count == args.max_messages:
                break
        if left and count != args.max_messages:
            raise CallFailed(f"timed out with {len(left)} partition(s) not read to the end")
    finally:
        consumer.close()
    return report


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", "backslashreplace")
