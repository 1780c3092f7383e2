"""The Produce response, written directly (versions 3 to 11, flexible from 9).

Every produce request is answered with one; built and encoded through the schema library
its per-partition and per-topic objects and the generic encoder were about a twentieth of
the event loop's CPU per request. The bytes are exactly the schema encoder's for the
fields the broker sets (``tests/protocol/test_produce_writer.py`` compares them): no
record errors, and none of the tagged fields of v10+ (``CurrentLeader``,
``NodeEndpoints``), which are written only when set.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from broker_core.codec.framing import Prewritten
from common.frames import Chunk

FLEXIBLE_VERSION = 9
_PARTITION_V3 = struct.Struct(">ihqq")
"""index, error_code, base_offset, log_append_time_ms"""
_PARTITION_V5 = struct.Struct(">ihqqq")
"""... and log_start_offset"""
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


class PartitionAnswer(NamedTuple):
    """One partition's answer to a produce."""

    partition: int
    error_code: int
    base_offset: int
    log_append_time_ms: int
    log_start_offset: int
    error_message: str | None


def _uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


class ProduceAnswer(Prewritten):
    """A Produce response: per topic (its name as the client wrote it) the partitions'
    answers, and ``throttle_time_ms`` (set when the request is throttled)."""

    __slots__ = ("throttle_time_ms", "topics", "version")

    def __init__(self, version: int, topics: list[tuple[str, list[PartitionAnswer]]],
                 throttle_time_ms: int = 0) -> None:
        self.version = version
        self.topics = topics
        self.throttle_time_ms = throttle_time_ms

    def encode(self) -> bytes:
        """The response body."""
        version, flexible = self.version, self.version >= FLEXIBLE_VERSION
        partition = _PARTITION_V5 if version >= 5 else _PARTITION_V3
        out = bytearray()
        self._count(out, len(self.topics), flexible)
        for name, partitions in self.topics:
            self._string(out, name, flexible)
            self._count(out, len(partitions), flexible)
            for answer in partitions:
                if version >= 5:
                    out += partition.pack(answer.partition, answer.error_code, answer.base_offset,
                                          answer.log_append_time_ms, answer.log_start_offset)
                else:
                    out += partition.pack(answer.partition, answer.error_code, answer.base_offset,
                                          answer.log_append_time_ms)
                if version >= 8:
                    self._count(out, 0, flexible)  # record_errors: none
                    self._string(out, answer.error_message, flexible)
                if flexible:
                    out.append(0)  # the partition's tagged fields: none
            if flexible:
                out.append(0)  # the topic's tagged fields: none
        out += _INT32.pack(self.throttle_time_ms)
        if flexible:
            out.append(0)  # the response's tagged fields: none
        return bytes(out)

    def encode_parts(self) -> tuple[list[Chunk], int]:
        body = self.encode()
        return [body], len(body)

    @staticmethod
    def _count(out: bytearray, count: int, flexible: bool) -> None:
        if flexible:
            _uvarint(out, count + 1)
        else:
            out += _INT32.pack(count)

    @staticmethod
    def _string(out: bytearray, value: str | None, flexible: bool) -> None:
        if value is None:
            if flexible:
                out.append(0)
            else:
                out += _INT16.pack(-1)
            return
        data = value.encode()
        if flexible:
            _uvarint(out, len(data) + 1)
        else:
            out += _INT16.pack(len(data))
        out += data
