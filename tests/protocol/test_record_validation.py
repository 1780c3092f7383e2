"""``validateRecords=true``: a batch whose CRC is right but whose records do not parse
answers INVALID_RECORD and is not written (without it, librdkafka consumers stall at such
a batch); every client's batches, in every compression, still go through."""

from __future__ import annotations

import gzip
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import confluent_kafka
import lz4.frame
import pytest

from broker_core.codec.compression import MAX_GZIP_MEMBERS, deflate
from tests.batches import values_batch
from tests.bombs import BOMBS
from tests.broker_process import BrokerProcess
from tests.clients import CONSUMERS, PRODUCERS, create_topic, make_records
from tests.interop.test_clients_roundtrip import COMPRESSIONS, check_roundtrip
from tests.protocol.test_bad_input import create, latest_offset, produce
from tests.raw import RawConnection, compressed_batch, resealed

INVALID_RECORD = 87


@pytest.fixture(scope="module")
def validating(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(Path(tmp_path_factory.mktemp("validating")),
                           {"validateRecords": "true"}).start()
    yield broker
    broker.stop()


def _garbage_records(batch: bytearray) -> bytes:
    batch[61:] = b"\xff" * (len(batch) - 61)
    return resealed(batch)


def _count_too_high(batch: bytearray) -> bytes:
    struct.pack_into(">i", batch, 23, 2)  # last offset delta: 3 records claimed, 2 sent
    struct.pack_into(">i", batch, 57, 3)
    return resealed(batch)


def _value_overruns_record(batch: bytearray) -> bytes:
    # the first record's value length (a 1-byte varint: 20 -> 40) claims 63 bytes
    at = bytes(batch).index(bytes([40]) + b"x" * 20)
    batch[at] = 126
    return resealed(batch)


def _gzip_stream_broken(batch: bytearray) -> bytes:
    batch[61 + 12:] = b"\x00" * (len(batch) - 61 - 12)
    return resealed(batch)


@pytest.mark.parametrize(("spoil", "compression"), [
    (_garbage_records, 0), (_count_too_high, 0), (_value_overruns_record, 0),
    (_gzip_stream_broken, 1)])
def test_unparsable_records_are_refused_and_not_written(
        validating: BrokerProcess, topic_name: str, spoil: Callable[[bytearray], bytes],
        compression: int) -> None:
    conn = RawConnection(validating.port)
    try:
        assert create(conn, topic_name) == 0
        assert produce(conn, topic_name, bytes(values_batch([b"before"]))).error_code == 0
        values = [b"x" * 20] * (2 if spoil is _count_too_high else 3)
        answer = produce(conn, topic_name, spoil(values_batch(values, compression=compression)))
        assert answer.error_code == INVALID_RECORD, answer
        assert latest_offset(conn, topic_name) == 1
        assert produce(conn, topic_name, bytes(values_batch([b"after"]))).error_code == 0
    finally:
        conn.close()
    validating.wait_for_log(rf"produce to {topic_name}-0 .*refused: malformed record")
    consumer = confluent_kafka.Consumer({"bootstrap.servers": validating.bootstrap,
                                         "group.id": "unused"})
    consumer.assign([confluent_kafka.TopicPartition(topic_name, 0, 0)])
    seen: list[bytes | None] = []
    deadline = time.monotonic() + 20
    while len(seen) < 2 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            seen.append(message.value())
    consumer.close()
    assert seen == [b"before", b"after"]


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
@pytest.mark.parametrize("payload", ["garbage", "bomb"])
def test_compressed_payloads_that_do_not_inflate_are_refused(
        validating: BrokerProcess, topic_name: str, codec: int, payload: str) -> None:
    """Garbage no codec takes, and bombs (80 MiB of zeros in a few kB; a snappy block
    claiming as much): INVALID_RECORD, nothing written, never inflated past 64 MiB."""
    data = bytes(range(256)) * 8 if payload == "garbage" else BOMBS[codec]()
    conn = RawConnection(validating.port)
    try:
        assert create(conn, topic_name) == 0
        answer = produce(conn, topic_name, compressed_batch(codec, data))
        assert answer.error_code == INVALID_RECORD, answer
        assert latest_offset(conn, topic_name) == 0
    finally:
        conn.close()
    pattern = "inflates past" if payload == "bomb" else \
        "(does not inflate|does not start with|cut short|runs past)"
    validating.wait_for_log(rf"produce to {topic_name}-0 .*refused: malformed record: .*"
                            rf"{pattern}")


@pytest.mark.parametrize("client", sorted(PRODUCERS))
@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_every_client_gets_through(validating: BrokerProcess, topic_name: str, client: str,
                                   compression: str) -> None:
    create_topic(validating.bootstrap, topic_name)
    base_ts = int(time.time() * 1000) - 1_000_000
    PRODUCERS[client](validating.bootstrap, topic_name, make_records(1500, base_ts),
                      compression)
    check_roundtrip(CONSUMERS[client](validating.bootstrap, topic_name, 1500), 1500, base_ts)


def _linked_lz4(records: bytes) -> bytes:
    # python-lz4's default: blocks linked, which Kafka's reader refuses
    packed: bytes = lz4.frame.compress(records, block_linked=True,
                                       block_size=lz4.frame.BLOCKSIZE_MAX64KB)
    return packed


def _many_gzip_members(records: bytes) -> bytes:
    return gzip.compress(records, mtime=0) + gzip.compress(b"", mtime=0) * MAX_GZIP_MEMBERS


def _lz4_and_more(records: bytes) -> bytes:
    return deflate(3, records) + b"trailing bytes Kafka's reader never reads"


@pytest.mark.parametrize(("codec", "pack", "why"), [
    (3, _linked_lz4, "links its blocks"), (3, _lz4_and_more, "follow the lz4 frame"),
    (1, _many_gzip_members, "members")])
def test_payloads_kafkas_reader_refuses_are_refused(
        validating: BrokerProcess, topic_name: str, codec: int,
        pack: Callable[[bytes], bytes], why: str) -> None:
    """LZ4 frames whose blocks are linked (the Java client: "Dependent block stream is
    unsupported") or followed by more bytes, and gzip payloads of more members than
    :data:`MAX_GZIP_MEMBERS` (each costs a decoder: 40,000 empty ones held the event loop
    for seconds): INVALID_RECORD, nothing written."""
    records = bytes(values_batch([b"x" * 100] * 700))[61:]  # more than one 64 KiB block
    conn = RawConnection(validating.port)
    try:
        assert create(conn, topic_name) == 0
        answer = produce(conn, topic_name, compressed_batch(codec, pack(records), 700))
        assert answer.error_code == INVALID_RECORD, answer
        assert latest_offset(conn, topic_name) == 0
    finally:
        conn.close()
    validating.wait_for_log(rf"produce to {topic_name}-0 .*refused: malformed record: .*{why}")


def test_a_record_varint_over_5_bytes_is_refused(validating: BrokerProcess,
                                                 topic_name: str) -> None:
    """A record's key length written in 6 bytes (Kafka reads at most 5; the Java client
    fails on the partition: "Varint is too long"): INVALID_RECORD, nothing written."""
    batch = bytearray(values_batch([b"v"]))
    at = 61 + 4  # record length, attributes, timestamp delta, offset delta: 1 byte each
    assert batch[at] == 0x01  # a null key
    batch[at:at + 1] = b"\x81\x80\x80\x80\x80\x00"  # the same, over 6 bytes
    batch[61] += 10  # the record length (zigzag): 5 bytes more
    conn = RawConnection(validating.port)
    try:
        assert create(conn, topic_name) == 0
        answer = produce(conn, topic_name, resealed(batch))
        assert answer.error_code == INVALID_RECORD, answer
        assert latest_offset(conn, topic_name) == 0
    finally:
        conn.close()
    validating.wait_for_log(rf"produce to {topic_name}-0 .*refused: .*over 5 bytes")
