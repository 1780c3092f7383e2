"""The codec's limits on hostile bytes, read from the bytes alone: gzip payloads of many
members refused past :data:`~broker_core.codec.compression.MAX_GZIP_MEMBERS` (each member
costs a decoder), LZ4 frames Kafka's reader refuses (linked blocks, a dictionary, another
version, bytes after the frame), record varints longer than Kafka reads them (5 bytes for
32-bit fields), and the batch header checks Kafka's broker makes (magic, an idempotent
batch's sequence, a compressed batch's record count). What a client sees on the wire is
tested against a broker in ``test_bad_input`` and ``test_record_validation``."""

from __future__ import annotations

import gzip
import os
import struct

import lz4.frame
import pytest

from broker_core.codec.batch_header import (
    MAX_COMPRESSED_RECORDS,
    validate_produced,
)
from broker_core.codec.compression import GZIP, LZ4, MAX_GZIP_MEMBERS, deflate, inflate
from broker_core.codec.errors import MalformedBatch
from broker_core.codec.varints import read_varint32
from broker_core.errors import ErrorCode, KafkaApiError
from tests.batches import build_batch
from tests.raw import compressed_batch, record_batch, resealed

RECORDS = bytes(build_batch([(b"k%d" % i, b"v" * 100) for i in range(20)]))[61:]


# gzip


def test_gzip_members_past_the_bound_are_refused() -> None:
    """Thousands of empty members (20 bytes each, inflating to nothing: never past the
    bound that sends a batch to a worker thread) cost a decoder each: refused past the
    bound, before any work on the members beyond it."""
    empty = gzip.compress(b"", mtime=0)
    assert inflate(GZIP, empty * MAX_GZIP_MEMBERS) == b""
    with pytest.raises(MalformedBatch, match=f"more than {MAX_GZIP_MEMBERS} members"):
        inflate(GZIP, empty * (MAX_GZIP_MEMBERS + 1))
    with pytest.raises(MalformedBatch, match="members"):
        inflate(GZIP, empty * 40_000)


def test_gzip_members_are_read_one_after_another() -> None:
    """Members of every size, the payload fed to each decoder in growing pieces: the
    records come out whole, and a member cut short or followed by garbage is refused."""
    big = os.urandom(300_000)  # does not compress: a member of about its size
    parts = [b"", b"a", RECORDS, big, b"z" * 100_000]
    payload = b"".join(gzip.compress(part, mtime=0) for part in parts)
    assert inflate(GZIP, payload) == b"".join(parts)
    assert inflate(GZIP, deflate(GZIP, RECORDS)) == RECORDS
    with pytest.raises(MalformedBatch, match="cut short"):
        inflate(GZIP, payload[:-3])
    with pytest.raises(MalformedBatch, match="does not inflate"):
        inflate(GZIP, payload + b"garbage!")
    with pytest.raises(MalformedBatch, match="inflates past"):
        inflate(GZIP, payload, cap=len(b"".join(parts)) - 1)


# lz4


def _frame(**options: object) -> bytes:
    out: bytes = lz4.frame.compress(RECORDS * 50, **options)
    return out


def test_lz4_frames_kafka_reads_are_read() -> None:
    for options in ({}, {"content_checksum": True}, {"store_size": True},
                    {"block_size": lz4.frame.BLOCKSIZE_MAX4MB}):
        assert inflate(LZ4, _frame(block_linked=False, **options)) == RECORDS * 50
    assert inflate(LZ4, deflate(LZ4, RECORDS)) == RECORDS


def test_lz4_frames_kafka_refuses_are_refused() -> None:
    """Kafka's reader takes one frame of version 1 with independent blocks, no dictionary
    and no reserved bit (the Java client fails on the others: "Dependent block stream is
    unsupported"), and reads nothing after it."""
    good = _frame(block_linked=False, block_size=lz4.frame.BLOCKSIZE_MAX64KB)
    linked = _frame(block_linked=True, block_size=lz4.frame.BLOCKSIZE_MAX64KB)
    assert not linked[4] & 0x20
    with pytest.raises(MalformedBatch, match="links its blocks"):
        inflate(LZ4, linked)
    with pytest.raises(MalformedBatch, match=r"3 bytes follow the lz4 frame"):
        inflate(LZ4, good + b"xyz")
    with pytest.raises(MalformedBatch, match="follow the lz4 frame"):
        inflate(LZ4, good + good)

    def flagged(flg: int, bd: int | None = None) -> bytes:
        # the descriptor's checksum is checked after the flags: left as it was
        return good[:4] + bytes([flg, good[5] if bd is None else bd]) + good[6:]

    with pytest.raises(MalformedBatch, match="version 2"):
        inflate(LZ4, flagged(good[4] & 0x3F | 0x80))
    with pytest.raises(MalformedBatch, match="dictionary"):
        inflate(LZ4, flagged(good[4] | 0x01))
    with pytest.raises(MalformedBatch, match="reserved"):
        inflate(LZ4, flagged(good[4] | 0x02))
    with pytest.raises(MalformedBatch, match="block descriptor"):
        inflate(LZ4, flagged(good[4], good[5] | 0x01))
    with pytest.raises(MalformedBatch, match="does not start with an lz4 frame"):
        inflate(LZ4, b"\x50\x2a\x4d\x18" + good[4:])  # a skippable frame's magic


# record varints


def test_read_varint32_takes_5_bytes_and_32_bits() -> None:
    """Kafka's ``readVarint``: 5 bytes at most ("Varint is too long" past them); the bits
    of a 5th byte past the 32nd, which Kafka drops, are refused here."""
    assert read_varint32(b"\x01", 0) == (-1, 1)
    assert read_varint32(b"\x81\x80\x80\x80\x00", 0) == (-1, 5)
    assert read_varint32(b"\xfe\xff\xff\xff\x0f", 0) == (2**31 - 1, 5)
    assert read_varint32(b"\xff\xff\xff\xff\x0f", 0) == (-(2**31), 5)
    with pytest.raises(MalformedBatch, match="over 5 bytes"):
        read_varint32(b"\x82\x80\x80\x80\x80\x00", 0)
    with pytest.raises(MalformedBatch, match="more than 32 bits"):
        read_varint32(b"\x80\x80\x80\x80\x10", 0)


# the batch header


def _edited(batch: bytes, at: int, fmt: str, value: int) -> bytes:
    edited = bytearray(batch)
    struct.pack_into(fmt, edited, at, value)
    return resealed(edited)


@pytest.mark.parametrize(("magic", "code"), [
    (0, ErrorCode.INVALID_RECORD), (1, ErrorCode.INVALID_RECORD),
    (3, ErrorCode.CORRUPT_MESSAGE), (-1, ErrorCode.CORRUPT_MESSAGE)])
def test_a_batch_of_another_magic_gets_kafkas_code(magic: int, code: ErrorCode) -> None:
    """Kafka: v0 and v1 batches in a Produce request of v3 or later are INVALID_RECORD
    (``ProduceRequest.validateRecords``); a magic byte out of 0..2 is a corrupt record
    set (``ByteBufferLogInputStream``)."""
    with pytest.raises(KafkaApiError) as refused:
        validate_produced(_edited(record_batch(2), 16, ">b", magic))
    assert refused.value.code == code


def test_an_idempotent_batch_needs_a_sequence() -> None:
    """Kafka's ``LogValidator.validateBatch``: a producer id and no base sequence."""
    batch = bytes(build_batch([(b"k", b"v")], producer_id=7, producer_epoch=0,
                              base_sequence=-1))
    with pytest.raises(KafkaApiError, match="invalid sequence number -1") as refused:
        validate_produced(batch)
    assert refused.value.code == ErrorCode.INVALID_RECORD
    sequenced = bytes(build_batch([(b"k", b"v")], producer_id=7, producer_epoch=0,
                                  base_sequence=0))
    assert validate_produced(sequenced).producer_id == 7


def test_a_compressed_batch_may_not_claim_more_records_than_it_can_inflate_to() -> None:
    """O(1), nothing inflated (the check that runs when ``validateRecords`` is off)."""
    def claiming(count: int) -> bytes:
        batch = _edited(compressed_batch(GZIP, gzip.compress(RECORDS), 20), 23, ">i",
                        count - 1)
        return _edited(batch, 57, ">i", count)

    assert validate_produced(claiming(MAX_COMPRESSED_RECORDS)).record_count == \
        MAX_COMPRESSED_RECORDS
    for count in (MAX_COMPRESSED_RECORDS + 1, 2**31 - 1):
        with pytest.raises(KafkaApiError, match=f"claims {count} records") as refused:
            validate_produced(claiming(count))
        assert refused.value.code == ErrorCode.INVALID_RECORD
