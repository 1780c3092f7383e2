"""The payload codecs of a v2 record batch (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd) and the
names the ``compression.type`` config gives them.

:func:`inflate` undoes a producer's compression with a cap (:data:`MAX_INFLATED_BYTES`),
so that a small batch cannot expand into gigabytes of memory; it reads what every client
writes (gzip members one after another, at most :data:`MAX_GZIP_MEMBERS` of them, snappy
raw or in the Java client's xerial framing, one LZ4 frame of independent blocks as Kafka's
reader takes it, zstd frames). :func:`deflate` writes what every client reads, framed
as Kafka's Java client frames it: gzip at the default level, snappy in xerial framing
with 32 KiB blocks, LZ4 frames of independent 64 KiB blocks, zstd at level 3 (Kafka's
default). Every codec package here releases the GIL while it works, so both run well in
an executor thread.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable

import lz4.frame
import snappy
import zstandard

from broker_core.codec.errors import MalformedBatch
from broker_core.codec.varints import read_uvarint

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODEC_BY_NAME = {"uncompressed": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4,
                 "zstd": ZSTD}
"""``compression.type`` values that name a codec; ``producer`` (keep the producer's) is
the other one."""
PRODUCER = "producer"
MAX_INFLATED_BYTES = 64 * 1024 * 1024
"""The most a compressed batch may inflate to before it is refused as malformed."""
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)  # version 1, compatible with 1
_XERIAL_BLOCK = 32 * 1024
_ZSTD_LEVEL = 3


def codec_of(compression_type: str) -> int | None:
    """The codec a topic's ``compression.type`` stores batches in; None for ``producer``."""
    return None if compression_type == PRODUCER else CODEC_BY_NAME[compression_type]


class _PastCap(MalformedBatch):
    """The payload inflates past the cap it was inflated with."""


def _capped(size: int, cap: int) -> None:
    if size > cap:
        raise _PastCap(f"the payload inflates past {cap} bytes")


MAX_GZIP_MEMBERS = 1024
"""The most gzip members a payload may hold (every client writes one per batch; gzip reads
any number, one after another, and Kafka's reader too): each costs a decoder set up in
Python, so a payload of thousands of empty ones would cost far more than its bytes."""
_GZIP_FIRST_FEED = 512
"""The bytes a member's decoder is first given; doubled while the member goes on, so that
the rest handed back after a member's end (``unused_data``, a copy) is never more than
about what the member took: the whole payload is read in time linear in its size."""


def _gunzip(data: bytes, cap: int) -> bytes:
    view = memoryview(data)
    out: list[bytes] = []
    total = pos = members = 0
    while pos < len(data):  # one gzip member after another, as gzip itself reads them
        members += 1
        if members > MAX_GZIP_MEMBERS:
            raise MalformedBatch(f"the gzip payload holds more than {MAX_GZIP_MEMBERS} "
                                 "members")
        inflater = zlib.decompressobj(wbits=31)
        feed = _GZIP_FIRST_FEED
        while not inflater.eof:
            if pos >= len(data):
                raise MalformedBatch("the gzip stream is cut short")
            chunk = view[pos:pos + feed]
            piece = inflater.decompress(chunk, cap + 1 - total)
            total += len(piece)
            _capped(total, cap)  # else the whole chunk was taken, or the member ended
            out.append(piece)
            pos += len(chunk) - len(inflater.unused_data)
            feed *= 2
    return b"".join(out)


def _unsnappy(data: bytes, cap: int) -> bytes:
    blocks = [data]
    if data.startswith(_XERIAL_MAGIC):  # the Java client's framing: sized blocks
        blocks, pos = [], 16
        while pos < len(data):
            (size,) = struct.unpack_from(">i", data, pos)
            if size < 0 or pos + 4 + size > len(data):
                raise MalformedBatch("a snappy block runs past the payload")
            blocks.append(data[pos + 4:pos + 4 + size])
            pos += 4 + size
    _capped(sum(read_uvarint(memoryview(block), 0)[0] for block in blocks), cap)  # sizes first
    return b"".join(snappy.uncompress(block) for block in blocks)


_LZ4_MAGIC = b"\x04\x22\x4d\x18"


def _lz4_descriptor_problem(data: bytes) -> str | None:
    """Why Kafka's LZ4 reader (``Lz4BlockInputStream``, whose FLG and BD rules the Java
    client and broker apply) refuses the frame ``data`` starts with, else None: one frame
    of the current version, independent blocks, no dictionary, no reserved bit set, a
    block size of 64 KiB to 4 MiB."""
    if len(data) < 7 or data[:4] != _LZ4_MAGIC:
        return "the payload does not start with an lz4 frame"
    flg, bd = data[4], data[5]
    if flg >> 6 != 1:
        return f"lz4 frame version {flg >> 6} is unsupported"
    if flg & 0x03:
        return "the lz4 frame sets reserved bits (or a dictionary id)"
    if not flg & 0x20:
        return "the lz4 frame links its blocks (dependent blocks are unsupported)"
    if bd & 0x8F or not 4 <= (bd >> 4) & 0x07 <= 7:
        return f"the lz4 frame's block descriptor {bd:#04x} is invalid"
    return None


def _unlz4(data: bytes, cap: int) -> bytes:
    problem = _lz4_descriptor_problem(data)
    if problem is not None:
        raise MalformedBatch(problem)
    inflater = lz4.frame.LZ4FrameDecompressor()
    out: bytes = inflater.decompress(data, max_length=cap + 1)
    _capped(len(out), cap)
    if not inflater.eof:
        raise MalformedBatch("the lz4 frame is cut short")
    if inflater.unused_data:
        raise MalformedBatch(f"{len(inflater.unused_data)} bytes follow the lz4 frame")
    return out


def _unzstd(data: bytes, cap: int) -> bytes:
    out, total = [], 0
    with zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True) as reader:
        while chunk := reader.read(min(1 << 20, cap + 1)):
            total += len(chunk)
            _capped(total, cap)
            out.append(chunk)
    return b"".join(out)


_INFLATE: dict[int, Callable[[bytes, int], bytes]] = {
    GZIP: _gunzip, SNAPPY: _unsnappy, LZ4: _unlz4, ZSTD: _unzstd}


def inflate(codec: int, payload: bytes, cap: int = MAX_INFLATED_BYTES) -> bytes:
    """The records ``payload`` compressed with ``codec`` holds; MalformedBatch when it does
    not inflate, inflates past ``cap``, or the codec is unknown."""
    inflater = _INFLATE.get(codec)
    if inflater is None:
        raise MalformedBatch(f"unknown compression codec {codec}")
    try:
        return inflater(payload, cap)
    except MalformedBatch:
        raise
    except Exception as exc:  # each codec has its own errors for a corrupt payload
        raise MalformedBatch(f"the payload does not inflate: {exc!r}") from exc


def inflate_within(codec: int, payload: bytes, limit: int) -> bytes | None:
    """:func:`inflate`, stopped once ``limit`` bytes came out: None then (the payload may be
    fine: inflate it with the cap elsewhere). A ``limit`` under the cap changes nothing
    else: what inflates within it, or fails to, does so as under the cap."""
    try:
        return inflate(codec, payload, min(limit, MAX_INFLATED_BYTES))
    except _PastCap:
        if limit < MAX_INFLATED_BYTES:
            return None
        raise


def _gzip(data: bytes) -> bytes:
    deflater = zlib.compressobj(wbits=31)
    return deflater.compress(data) + deflater.flush()


def _snappy(data: bytes) -> bytes:
    view = memoryview(data)
    parts = [_XERIAL_HEADER]
    for at in range(0, len(data), _XERIAL_BLOCK):
        block: bytes = snappy.compress(bytes(view[at:at + _XERIAL_BLOCK]))
        parts += [struct.pack(">i", len(block)), block]
    return b"".join(parts)


def _lz4(data: bytes) -> bytes:
    # Kafka's Java reader decodes each block on its own: blocks must not be linked
    out: bytes = lz4.frame.compress(data, block_size=lz4.frame.BLOCKSIZE_MAX64KB,
                                    block_linked=False, content_checksum=False,
                                    store_size=False)
    return out


def _zstd(data: bytes) -> bytes:
    out: bytes = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(data)
    return out


_DEFLATE: dict[int, Callable[[bytes], bytes]] = {
    NONE: bytes, GZIP: _gzip, SNAPPY: _snappy, LZ4: _lz4, ZSTD: _zstd}


def deflate(codec: int, records: bytes) -> bytes:
    """``records`` (a batch's uncompressed record bytes) compressed with ``codec``."""
    return _DEFLATE[codec](records)
