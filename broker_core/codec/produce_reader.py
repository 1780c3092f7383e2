"""The Produce request, read directly (versions 3 to 11, flexible from 9).

The schema library's decoder copies each partition's records out of the frame and builds
its objects for every topic and partition; here the records stay a view of the frame (the
append copies them once, into the batch it stamps) and the objects are plain slotted ones.
What is read, and what is refused, is the schema decoder's (``tests/protocol/
test_produce_reader.py`` compares them): lengths and counts as it reads them (a negative
length is a null, a count below -1 an empty array, a field running past the end of the
frame is cut there), tagged fields skipped, bytes after the body ignored; a null where the
schema forbids one is reported after the whole body was read, as
:mod:`broker_core.null_fields` reports it (the first in field order).

Hostile bodies cost what they weigh: an unsigned varint longer than 5 bytes is garbage (as
Kafka's ``readUnsignedVarint`` refuses it; :func:`broker_core.codec.varints.read_uvarint`),
and so is an array whose count of entries cannot fit in the bytes left, each entry taking
at least its fixed fields (as Kafka's generated readers refuse a count past the bytes
remaining): no object is built for an entry that is not there.
"""

from __future__ import annotations

import struct

from broker_core.codec.varints import read_uvarint

FLEXIBLE_VERSION = 9
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")
_TOPIC_BYTES = (6, 3)
"""The fewest bytes a topic entry takes (its name's length and its partitions' count;
flexible: one byte each, and its tagged fields), not flexible and flexible..."""
_PARTITION_BYTES = (8, 6)
"""... and a partition entry (its index, its records' length; flexible: and its tags)."""


class ForbiddenNull(ValueError):
    """A non-nullable field of the request is null; ``path`` is its dotted name."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class PartitionData:
    """One partition's batch: its index and records (a view of the frame, or None)."""

    __slots__ = ("index", "records")

    def __init__(self, index: int, records: memoryview | None) -> None:
        self.index = index
        self.records = records


class TopicData:
    """One topic's partitions, under the name the client wrote."""

    __slots__ = ("name", "partition_data")

    def __init__(self, name: str, partition_data: list[PartitionData]) -> None:
        self.name = name
        self.partition_data = partition_data


class ProduceBody:
    """A decoded Produce request."""

    __slots__ = ("acks", "timeout_ms", "topic_data", "transactional_id", "version")

    def __init__(self, version: int, transactional_id: str | None, acks: int,
                 timeout_ms: int, topic_data: list[TopicData]) -> None:
        self.version = version
        self.transactional_id = transactional_id
        self.acks = acks
        self.timeout_ms = timeout_ms
        self.topic_data = topic_data


class _Reader:
    """A position in the body and the reads of its field types."""

    __slots__ = ("data", "flexible", "pos")

    def __init__(self, data: memoryview, flexible: bool) -> None:
        self.data = data
        self.flexible = flexible
        self.pos = 0

    def uvarint(self) -> int:
        value, self.pos = read_uvarint(self.data, self.pos)
        return value

    def int32(self) -> int:
        (value,) = _INT32.unpack_from(self.data, self.pos)
        self.pos += 4
        return int(value)

    def length(self, short: bool) -> int:
        """A string's (``short``: int16 when not flexible) or an array's or bytes' length
        or count; -1 for null."""
        if self.flexible:
            return self.uvarint() - 1
        if short:
            (value,) = _INT16.unpack_from(self.data, self.pos)
            self.pos += 2
            return int(value)
        return self.int32()

    def count(self, least: tuple[int, int]) -> int:
        """An array's count (-1 for null), refused as garbage when that many entries of at
        least ``least`` bytes (not flexible, flexible) cannot fit in the bytes left."""
        count = self.length(False)
        if count * least[self.flexible] > len(self.data) - self.pos:
            raise ValueError(f"an array of {count} entries in {len(self.data) - self.pos} "
                             "bytes")
        return count

    def string(self) -> str | None:
        size = self.length(True)
        if size < 0:
            return None
        start = self.pos
        self.pos += size
        return str(self.data[start:start + size], "utf-8")

    def records(self) -> memoryview | None:
        size = self.length(False)
        if size < 0:
            return None
        start = self.pos
        self.pos += size
        return self.data[start:start + size]

    def skip_tags(self) -> None:
        """A flexible struct's tagged fields: none is one the broker reads."""
        if self.data[self.pos] == 0:  # the usual case: none
            self.pos += 1
            return
        for _ in range(self.uvarint()):
            self.uvarint()  # the tag
            size = self.uvarint()
            self.pos = min(self.pos + size, len(self.data))  # cut at the end, as read


def decode_produce(body: memoryview, version: int) -> ProduceBody:
    """Read a Produce request's body at ``version`` (3 to 11). Garbage raises (a
    struct.error, an IndexError, a ValueError); a forbidden null raises ForbiddenNull
    once the whole body was read."""
    flexible = version >= FLEXIBLE_VERSION
    read = _Reader(body, flexible)
    null: str | None = None
    transactional_id = read.string()
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(body, read.pos)
    read.pos += 6
    count = read.count(_TOPIC_BYTES)
    topics: list[TopicData] = []
    if count == -1:
        null = "topic_data"
    for _ in range(count):
        name = read.string()
        if name is None and null is None:
            null = "topic_data.name"
        partition_count = read.count(_PARTITION_BYTES)
        if partition_count == -1 and null is None:
            null = "topic_data.partition_data"
        partitions = []
        for _ in range(partition_count):
            index = read.int32()
            partitions.append(PartitionData(index, read.records()))
            if flexible:
                read.skip_tags()
        topics.append(TopicData(name or "", partitions))
        if flexible:
            read.skip_tags()
    if flexible:
        read.skip_tags()
    if null is not None:
        raise ForbiddenNull(null)
    return ProduceBody(version, transactional_id, int(acks), int(timeout_ms), topics)
