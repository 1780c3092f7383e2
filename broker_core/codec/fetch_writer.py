"""The Fetch response written by hand (v4 to v12), as a list of buffers.

Fetch is the one response whose size is mostly record bytes. The schema library would
copy every batch into its encode buffer, and framing would copy the whole body again;
here the fixed fields are packed into small ``bytes`` and each batch stays the buffer the
log returned (a memoryview of the read window, or a file region sent with ``sendfile``),
so the record bytes are not copied again in Python. ``tests/protocol/test_fetch_wire.py`` checks
every version byte for byte against ``kafka.protocol``'s ``FetchResponse``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from broker_core.codec.framing import Prewritten
from broker_core.codec.varints import uvarint
from common.frames import Chunk

_HEAD_V4 = struct.Struct(">i")  # throttle_time_ms
_HEAD_V7 = struct.Struct(">ihi")  # throttle_time_ms, error_code, session_id
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")
_PARTITION_V4 = struct.Struct(">ihqq")  # index, error, high watermark, last stable
_PARTITION_V5 = struct.Struct(">ihqqq")  # ... and log start offset
_ABORTED = struct.Struct(">qq")  # producer id, first offset
_NO_TAGS = b"\x00"
FLEXIBLE_FROM = 12
MIN_VERSION = 4
MAX_VERSION = 12


@dataclass(slots=True)
class PartitionAnswer:
    """One partition of a Fetch response; ``batches`` are whole v2 record batches."""

    index: int
    error: int
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted: list[tuple[int, int]] | None = None
    batches: Sequence[Chunk] = ()

    @property
    def size(self) -> int:
        """The record bytes this partition carries."""
        return sum(len(batch) for batch in self.batches)


@dataclass(slots=True)
class TopicAnswer:
    """One topic of a Fetch response, named as the client wrote it."""

    name: str
    partitions: list[PartitionAnswer]


def _array_length(count: int, flexible: bool) -> bytes:
    return uvarint(count + 1) if flexible else _INT32.pack(count)


def _string(text: str, flexible: bool) -> bytes:
    raw = text.encode("utf-8")
    return (uvarint(len(raw) + 1) if flexible else _INT16.pack(len(raw))) + raw


def _partition_fields(version: int, part: PartitionAnswer, records: int) -> bytes:
    """Everything of a partition up to and including the records' length."""
    flexible = version >= FLEXIBLE_FROM
    if version >= 5:
        head = _PARTITION_V5.pack(part.index, part.error, part.high_watermark,
                                  part.last_stable_offset, part.log_start_offset)
    else:
        head = _PARTITION_V4.pack(part.index, part.error, part.high_watermark,
                                  part.last_stable_offset)
    pieces = [head]
    if part.aborted is None:
        pieces.append(b"\x00" if flexible else b"\xff\xff\xff\xff")
    else:
        pieces.append(_array_length(len(part.aborted), flexible))
        for producer_id, first_offset in part.aborted:
            pieces.append(_ABORTED.pack(producer_id, first_offset))
            if flexible:
                pieces.append(_NO_TAGS)
    if version >= 11:
        pieces.append(_INT32.pack(-1))  # preferred read replica: none
    pieces.append(uvarint(records + 1) if flexible else _INT32.pack(records))
    return b"".join(pieces)


@dataclass(slots=True)
class FetchAnswer(Prewritten):
    """A whole Fetch response, encoded by :func:`encode_fetch_response`."""

    version: int
    topics: list[TopicAnswer]
    throttle_time_ms: int = 0
    error_code: int = 0
    """The top-level error (v7 on: a fetch session's; then no topics)."""

    @property
    def record_bytes(self) -> int:
        """The record bytes the answer carries (what a consumer byte rate counts)."""
        return sum(part.size for topic in self.topics for part in topic.partitions)

    def encode_parts(self) -> tuple[list[Chunk], int]:
        return encode_fetch_response(self.version, self.topics, self.throttle_time_ms,
                                     self.error_code)


def encode_fetch_response(version: int, topics: Sequence[TopicAnswer],
                          throttle_time_ms: int = 0, error_code: int = 0
                          ) -> tuple[list[Chunk], int]:
    """The response body as buffers to write in order, and its total size in bytes (the
    session id always 0: no fetch session is handed out)."""
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise ValueError(f"Fetch v{version} is not written by hand")
    flexible = version >= FLEXIBLE_FROM
    head = (_HEAD_V7.pack(throttle_time_ms, error_code, 0) if version >= 7
            else _HEAD_V4.pack(throttle_time_ms))
    parts: list[Chunk] = []
    pending = [head, _array_length(len(topics), flexible)]
    total = 0
    for topic in topics:
        pending.append(_string(topic.name, flexible))
        pending.append(_array_length(len(topic.partitions), flexible))
        for part in topic.partitions:
            size = part.size
            pending.append(_partition_fields(version, part, size))
            if part.batches:
                fixed = b"".join(pending)
                parts.append(fixed)
                parts.extend(part.batches)
                total += len(fixed) + size
                pending = []
            if flexible:
                pending.append(_NO_TAGS)  # the partition's tagged fields
        if flexible:
            pending.append(_NO_TAGS)  # the topic's tagged fields
    if flexible:
        pending.append(_NO_TAGS)  # the response's tagged fields
    fixed = b"".join(pending)
    parts.append(fixed)
    total += len(fixed)
    return parts, total
