"""Request framing: parsing request headers and encoding framed responses.

Schemas come from ``kafka.protocol`` (one class per API); this module only deals with the
header that precedes every request body and the size prefix and header of every response,
and the chunks a response written by hand (:class:`Prewritten`) is made of.
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from kafka.protocol.api_data import ApiData

from broker_core.codec.errors import ProtocolError
from broker_core.codec.varints import read_uvarint
from common.frames import Chunk

_HEADER_FIXED = struct.Struct(">hhi")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """The parsed request header (v1 or v2)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def received_bytes(value: bytes | ApiData) -> bytes:
    """A bytes field of a decoded request: kafka-python types such fields as bytes or an
    ApiData, which only a message being built (going out) holds."""
    if not isinstance(value, bytes):
        raise ProtocolError("a bytes field decoded as structured data")
    return value


def peek_header(frame: memoryview) -> tuple[int, int, int]:
    """Return ``(api_key, api_version, correlation_id)`` from the fixed start of a request."""
    if len(frame) < _HEADER_FIXED.size:
        raise ProtocolError(f"request of {len(frame)} bytes is shorter than a request header")
    key, version, correlation_id = _HEADER_FIXED.unpack_from(frame, 0)
    return key, version, correlation_id


def parse_header(frame: memoryview, flexible: bool) -> tuple[RequestHeader, int]:
    """Parse the request header; return it and the offset where the body starts.

    ``flexible`` selects header v2 (tagged fields follow the client id), else header v1.
    """
    key, version, correlation_id = peek_header(frame)
    pos = _HEADER_FIXED.size
    if pos + 2 > len(frame):
        raise ProtocolError("truncated client id")
    (length,) = _INT16.unpack_from(frame, pos)
    pos += 2
    client_id: str | None = None  # any negative length is null, as Kafka reads it
    if length >= 0:
        if pos + length > len(frame):
            raise ProtocolError("truncated client id")
        # Kafka decodes it as Java does, each malformed sequence replaced (U+FFFD)
        client_id = bytes(frame[pos : pos + length]).decode("utf-8", "replace")
        pos += length
    if flexible:
        count, pos = read_uvarint(frame, pos)
        for _ in range(count):
            _tag, pos = read_uvarint(frame, pos)
            size, pos = read_uvarint(frame, pos)
            pos += size
            if pos > len(frame):
                raise ProtocolError("truncated tagged field in request header")
    return RequestHeader(key, version, correlation_id, client_id), pos


def response_header(correlation_id: int, flexible: bool) -> bytes:
    """Encode a response header: v1 (with an empty tagged-field section) when ``flexible``."""
    head = _INT32.pack(correlation_id)
    return head + b"\x00" if flexible else head


def frame_response(header: bytes, body: bytes | bytearray | memoryview) -> bytes:
    """Join a response header and body behind the 4-byte size prefix."""
    return b"".join((_INT32.pack(len(header) + len(body)), header, body))




class Prewritten(ABC):
    """A response that writes its own body as chunks instead of going through the schema
    library (the hot paths a profile proved hot)."""

    @abstractmethod
    def encode_parts(self) -> tuple[list[Chunk], int]:
        """The body's chunks in order, and their total length."""


def frame_parts(header: bytes, parts: Sequence[Chunk], size: int) -> list[Chunk]:
    """The chunks of a response behind its size prefix and header."""
    return [_INT32.pack(len(header) + size) + header, *parts]
