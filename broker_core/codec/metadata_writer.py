"""The Metadata response's topics written by hand (v0 to v12).

With thousands of partitions a Metadata answer is mostly partition entries: building one
schema object per partition and encoding it through the schema library cost about 0.3 s
of the event loop for 10,000 partitions (librdkafka asks for every known topic a few
times per producer). Here a partition is a tuple and its bytes are packed directly; the
rest of the response (brokers, cluster id, controller) still goes through ``kafka.protocol``
and the hand-written topics array is put in its place. ``tests/protocol/test_metadata_wire.py``
checks every version byte for byte against ``kafka.protocol``'s ``MetadataResponse``.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from kafka.protocol.metadata import MetadataResponse

from broker_core.codec.framing import Prewritten
from broker_core.codec.varints import uvarint
from common.frames import Chunk

FLEXIBLE_FROM = 9
MAX_VERSION = 12
_NO_OPERATIONS = 1 << 31
"""``authorized_operations`` when not asked for (the schema's default, -2^31)."""
_UINT32 = struct.Struct(">I")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_PARTITION_V0 = struct.Struct(">hii")  # error, index, leader
_PARTITION_V7 = struct.Struct(">hiii")  # ... and leader epoch
_NO_TAGS = b"\x00"
_ZERO_ID = bytes(16)

Partition = tuple[int, int, int, int, tuple[int, ...]]
"""(error code, partition index, leader id, leader epoch, replica nodes); the in-sync
nodes are the replica nodes and no replica is offline (one copy per partition)."""


@dataclass(slots=True)
class TopicMetadata:
    """One topic of a Metadata response."""

    error_code: int
    name: str | None
    topic_id: uuid.UUID | None
    """None is written as the zero id (as the schema library does)."""
    is_internal: bool
    partitions: Sequence[Partition] = ()
    authorized_operations: set[int] | None = None
    """The operation codes the caller may apply, when asked for (v8+)."""


@dataclass(slots=True)
class MetadataAnswer(Prewritten):
    """A whole Metadata response: ``head`` (a ``MetadataResponse`` without topics, through
    the schema library) with ``topics`` written by hand in its topics array."""

    head: MetadataResponse
    topics: list[TopicMetadata] = field(default_factory=list)

    @property
    def version(self) -> int:
        return int(self.head.version)

    @property
    def throttle_time_ms(self) -> int:
        return int(self.head.throttle_time_ms)

    @throttle_time_ms.setter
    def throttle_time_ms(self, value: int) -> None:
        self.head.throttle_time_ms = value

    def encode_parts(self) -> tuple[list[Chunk], int]:
        before, after = _split_head(self.head)
        middle = encode_topics(self.version, self.topics)
        return [before, middle, after], len(before) + len(middle) + len(after)


def _split_head(head: MetadataResponse) -> tuple[bytes, bytes]:
    """``head`` encoded (it has no topics), cut around its empty topics array: what comes
    before the array and what follows it (cluster operations in v8-10, tagged fields)."""
    version = int(head.version)
    if head.topics:
        raise ValueError("the head of a MetadataAnswer carries no topics")
    encoded = bytes(head.encode())
    tail = (4 if 8 <= version <= 10 else 0) + (1 if version >= FLEXIBLE_FROM else 0)
    empty = 1 if version >= FLEXIBLE_FROM else 4
    cut = len(encoded) - tail
    return encoded[:cut - empty], encoded[cut:]


def _array_length(count: int, flexible: bool) -> bytes:
    return uvarint(count + 1) if flexible else _INT32.pack(count)


def _string(text: str | None, flexible: bool) -> bytes:
    if text is None:  # nullable in v12+ only (compact: length 0)
        return b"\x00" if flexible else b"\xff\xff"
    raw = text.encode("utf-8")
    return (uvarint(len(raw) + 1) if flexible else _INT16.pack(len(raw))) + raw


def _nodes(nodes: tuple[int, ...], flexible: bool) -> bytes:
    return _array_length(len(nodes), flexible) + b"".join(_INT32.pack(n) for n in nodes)


def encode_topics(version: int, topics: Sequence[TopicMetadata]) -> bytes:
    """The topics array of a Metadata response of ``version``."""
    if not 0 <= version <= MAX_VERSION:
        raise ValueError(f"Metadata v{version} is not written by hand")
    flexible = version >= FLEXIBLE_FROM
    out = [_array_length(len(topics), flexible)]
    for topic in topics:
        out.append(_INT16.pack(topic.error_code))
        out.append(_string(topic.name, flexible))
        if version >= 10:
            out.append(_ZERO_ID if topic.topic_id is None else topic.topic_id.bytes)
        if version >= 1:
            out.append(b"\x01" if topic.is_internal else b"\x00")
        out.append(_partitions(version, topic.partitions, flexible))
        if version >= 8:
            operations = topic.authorized_operations
            out.append(_UINT32.pack(_NO_OPERATIONS if operations is None
                                    else sum(1 << code for code in operations)))
        if flexible:
            out.append(_NO_TAGS)
    return b"".join(out)


def _partitions(version: int, partitions: Sequence[Partition], flexible: bool) -> bytes:
    """A topic's partitions array; the node lists of a topic's partitions are mostly the
    same, so each distinct one is encoded once."""
    empty = _array_length(0, flexible)
    ending = empty if version >= 5 else b""  # offline replicas: none
    if flexible:
        ending += _NO_TAGS
    tails: dict[tuple[int, ...], bytes] = {}
    out = [_array_length(len(partitions), flexible)]
    with_epoch = version >= 7
    pack = _PARTITION_V7.pack if with_epoch else _PARTITION_V0.pack
    for error, index, leader, epoch, nodes in partitions:
        tail = tails.get(nodes)
        if tail is None:
            listed = _nodes(nodes, flexible)
            tail = tails[nodes] = listed + listed + ending  # replicas, then in-sync
        out.append(pack(error, index, leader, epoch) if with_epoch
                   else pack(error, index, leader))
        out.append(tail)
    return b"".join(out)
