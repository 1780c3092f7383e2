"""The produce-time rework of a batch's records (``broker_core.codec.rework``), without a
broker: every codec into every other one keeps every header field but the codec, length
and CRC, and the records byte for byte; a batch that needs nothing is left alone; a
payload that does not inflate, or a missing key where keys are required, is
INVALID_RECORD. The codecs' output is read back by kafka-python's own decoders. The headers
the rework and the LogAppendTime stamp give are those their bytes hold."""

from __future__ import annotations

import itertools
import zlib

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from broker_core.codec.batch_header import (
    read_header,
    same_batch,
    set_base_offset,
    stamp_log_append_time,
    validate_produced,
)
from broker_core.codec.compression import CODEC_BY_NAME, codec_of
from broker_core.codec.rework import Rework, rework
from broker_core.errors import ErrorCode, KafkaApiError
from tests.raw import compressed_batch

CODECS = range(5)  # none, gzip, snappy, lz4, zstd


def built(codec: int, count: int = 300, keys: bool = True) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=True,
                                        producer_id=4242, producer_epoch=7, base_sequence=1000,
                                        batch_size=1 << 22)
    for i in range(count):
        builder.append(i, timestamp=1_700_000_000_000 + 3 * i,
                       key=f"key-{i}".encode() if keys or i % 2 else None,
                       value=(f"value-{i}-".encode() * (1 + i % 40)) + bytes([i % 256]),
                       headers=[("h", f"hv-{i}".encode()), ("empty", b"")])
    return bytes(builder.build())


def records_of(batch: bytes) -> list[tuple[int, int, bytes | None, bytes | None, object]]:
    return [(r.offset, r.timestamp, r.key, r.value, r.headers)
            for r in DefaultRecordBatch(batch)]


@pytest.mark.parametrize(("source", "target"),
                         [pair for pair in itertools.product(CODECS, CODECS)
                          if pair[0] != pair[1]])
def test_every_codec_into_every_other_keeps_all_but_the_codec(source: int,
                                                              target: int) -> None:
    sent = built(source)
    header = validate_produced(sent)
    plan = Rework.needed(header, target, keyed=False, walk=True)
    assert plan == Rework(target, True, False)
    done = rework(sent, header, plan)
    assert done is not None
    out, reworked = done
    stored = validate_produced(out)  # length, CRC and codec are right
    assert reworked == stored  # the header it gives is the batch's
    assert stored.compression == target
    for name in ("magic", "last_offset_delta", "base_timestamp", "max_timestamp",
                 "producer_id", "producer_epoch", "base_sequence", "record_count",
                 "is_transactional", "log_append_time"):
        assert getattr(stored, name) == getattr(header, name), name
    assert out[:8] == sent[:8] and out[12:17] == sent[12:17]  # base offset, leader epoch
    batch = DefaultRecordBatch(bytes(out))
    assert batch.validate_crc() and batch.compression_type == target
    assert records_of(bytes(out)) == records_of(sent)


@pytest.mark.parametrize("codec", CODECS)
def test_a_batch_in_the_topic_codec_or_a_producer_topic_needs_nothing(codec: int) -> None:
    header = read_header(built(codec, 3))
    assert Rework.needed(header, codec, keyed=False, walk=True) is None
    assert Rework.needed(header, None, keyed=False, walk=True) is None
    keyed = Rework.needed(header, None, keyed=True, walk=False)
    assert keyed == Rework(None, False, True)
    assert rework(built(codec, 3), header, keyed) is None  # checked, kept as it came


def test_the_config_names_map_to_codecs() -> None:
    assert [codec_of(name) for name in CODEC_BY_NAME] == list(CODECS)
    assert codec_of("producer") is None


def test_a_payload_that_does_not_inflate_is_invalid_record() -> None:
    sent = compressed_batch(1, b"\x1f\x8b" + b"\x00" * 30)
    with pytest.raises(KafkaApiError) as failure:
        rework(sent, read_header(sent), Rework(4, False, False))
    assert failure.value.code == ErrorCode.INVALID_RECORD


def test_a_header_claiming_more_records_than_the_bytes_hold_is_invalid_record() -> None:
    # a gzip payload of 10 bytes claiming 1,000 records: kept compressed it costs nothing
    # to check, written out uncompressed it would claim 1,000 offsets for 10 bytes
    sent = compressed_batch(1, zlib.compress(b"\x00" * 10, wbits=31), count=1000)
    with pytest.raises(KafkaApiError) as failure:
        rework(sent, read_header(sent), Rework(0, False, False))
    assert failure.value.code == ErrorCode.INVALID_RECORD


@pytest.mark.parametrize("codec", CODECS)
def test_a_record_without_a_key_is_refused_where_keys_are_required(codec: int) -> None:
    sent = built(codec, 10, keys=False)
    with pytest.raises(KafkaApiError) as failure:
        rework(sent, read_header(sent), Rework(None, False, True))
    assert failure.value.code == ErrorCode.INVALID_RECORD
    assert "no key" in failure.value.message
    assert rework(built(codec, 10), read_header(built(codec, 10)),
                  Rework(None, False, True)) is None


@pytest.mark.parametrize("codec", CODECS)
def test_stamping_log_append_time_gives_the_batch_header_as_stamped(codec: int) -> None:
    """The engine reads a produced batch's header once and hands the stamped one down to
    storage: it must be the header the stamped bytes hold."""
    batch = bytearray(built(codec, 5))
    header = validate_produced(batch)
    stamped = stamp_log_append_time(batch, header, 1_800_000_000_000)
    assert stamped == validate_produced(batch)  # CRC sealed again, fields as read back
    assert stamped.log_append_time and stamped.max_timestamp == 1_800_000_000_000
    assert DefaultRecordBatch(bytes(batch)).validate_crc()


def test_a_retry_is_the_same_batch_as_its_stored_copy_even_stamped_log_append_time() -> None:
    """How a produce whose commit's answer was lost is judged by what is stored
    (``PartitionStore.holds``): the stored copy has its offset set, and on a LogAppendTime
    topic the broker's timestamp-type bit and max timestamp; the client's retry has
    neither. Any other difference is another batch."""
    sent = built(0, 5)
    stored = bytearray(sent)
    set_base_offset(stored, 1234)
    assert same_batch(stored, sent)
    stamp_log_append_time(stored, validate_produced(stored), 1_800_000_000_000)
    assert same_batch(stored, sent)
    assert not same_batch(stored, sent[:-1])
    for at in (22, 30, 50, len(sent) - 1):  # attributes, base timestamp, producer id, a record
        other = bytearray(sent)
        other[at] ^= 1
        assert not same_batch(stored, other)
        assert not same_batch(sent, other)
