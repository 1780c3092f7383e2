"""Helpers for storage tests: the bytes of what ``PartitionLog.read`` returns, the
entries of a ledger file as found on disk (to damage one on purpose), a librdkafka
read of one partition that keeps the fetch errors it meets, and the check that what
producers were acknowledged is stored where their delivery reports said."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import confluent_kafka

from broker_core.codec.batch_header import BatchHeader, read_header
from broker_core.storage import FileRegion, TopicInfo
from broker_core.storage.entry import ENTRY_HEADER_SIZE, decode_entry_header
from broker_core.storage.memory import MemoryStorage
from tests.clients import Got, consume_confluent


def headed(batch: bytearray) -> tuple[bytearray, BatchHeader]:
    """``batch`` and its header, as a partition store's ``append`` takes them."""
    return batch, read_header(batch)


def region_bytes(region: FileRegion) -> bytes:
    """The bytes of a file region, read from its descriptor as the TLS writer does."""
    data = os.pread(region.fd, region.length, region.offset)
    assert len(data) == region.length, (len(data), region.length)
    return data


def batch_bytes(chunk: memoryview | FileRegion) -> bytes:
    """A batch's bytes, whether it came back as a memoryview or as a file region."""
    if isinstance(chunk, FileRegion):
        try:
            return region_bytes(chunk)
        finally:
            chunk.release()
    return bytes(chunk)


@dataclass(frozen=True)
class StoredEntry:
    """One entry of a ledger file: where it starts, its base offset and its size."""

    position: int
    index: int
    size: int


def stored_entries(path: Path) -> list[StoredEntry]:
    """The entries of the ledger file at ``path``, read from its entry headers."""
    data = path.read_bytes()
    entries: list[StoredEntry] = []
    position = 0
    while position < len(data):
        header = decode_entry_header(data, position)
        assert header is not None, f"{path}: no entry at {position}"
        size = ENTRY_HEADER_SIZE + header.batch_length
        entries.append(StoredEntry(position, header.index, size))
        position += size
    return entries


def partition_dir(data_dir: Path, topic: str, partition: int = 0) -> Path:
    """Where the broker keeps a partition of ``topic`` of the default tenant."""
    return data_dir / "topics" / "public" / "default" / topic / str(partition)


def flip_byte(path: Path, position: int) -> None:
    """Invert the bits of one byte of a file."""
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0xFF]))


def read_partition(bootstrap: str, topic: str, partition: int, start: int, end: int,
            timeout: float = 20.0) -> tuple[dict[int, bytes], set[int]]:
    """Read ``partition`` from ``start`` until offset ``end - 1`` arrives or a fetch error
    comes back; return the records by offset and the error codes seen."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"reader-{topic}",
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "fetch.error.backoff.ms": 50})
    consumer.assign([confluent_kafka.TopicPartition(topic, partition, start)])
    records: dict[int, bytes] = {}
    errors: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not errors and (end - 1) not in records:
            for message in consumer.consume(100, 0.5):
                error = message.error()
                if error is not None:
                    errors.add(error.code())
                else:
                    offset, value = message.offset(), message.value()
                    assert offset is not None and value is not None, message
                    records[offset] = value
    finally:
        consumer.close()
    return records, errors


class TopicReadsCounted(MemoryStorage):
    """A memory storage that counts the reads of its whole topic list (what a request
    should do once, not once per item)."""

    reads = 0

    def topics(self) -> list[TopicInfo]:
        self.reads += 1
        return super().topics()


def delivered_at(msg: confluent_kafka.Message) -> tuple[int, int]:
    """The (partition, offset) a successful delivery report gives: both known."""
    partition, offset = msg.partition(), msg.offset()
    assert partition is not None and offset is not None and offset >= 0, (partition, offset)
    return partition, offset


def check_log(bootstrap: str, topic: str, delivered: Mapping[bytes, tuple[int, int]],
              expected: int, partitions: int) -> list[Got]:
    """Every acknowledged record (``delivered``: value -> (partition, offset) of its delivery
    report) is stored once, where its report said; ``expected`` records in all, every
    partition's offsets running from 0 without a gap. What was read, for further checks."""
    got = consume_confluent(bootstrap, topic, expected, partitions)
    assert len(got) == expected
    values = [g.rec.value or b"" for g in got]
    assert len(set(values)) == len(values), "a record is stored twice"
    stored = {g.rec.value or b"": (g.partition, g.offset) for g in got}
    for value, where in delivered.items():
        assert stored.get(value) == where, f"acknowledged {value!r} at {where} is not there"
    by_partition: dict[int, list[int]] = {}
    for g in got:
        by_partition.setdefault(g.partition, []).append(g.offset)
    for offsets in by_partition.values():
        assert sorted(offsets) == list(range(len(offsets)))  # continuous
    return got
