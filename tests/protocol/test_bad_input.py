"""Acceptance 4: bad input gets Kafka's answer or a closed connection, and the broker serves on."""

from __future__ import annotations

import random
import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.consumer import (
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from tests.bombs import BOMBS
from tests.broker_process import BrokerProcess
from tests.raw import RawConnection, compressed_batch, fetch_request, record_batch, resealed

CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
OFFSET_OUT_OF_RANGE = 1
INVALID_TOPIC_EXCEPTION = 17
INVALID_REQUIRED_ACKS = 21
UNSUPPORTED_VERSION = 35
INVALID_RECORD = 87


@pytest.fixture(scope="module")
def strict_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker with auto topic creation off and a 1 MiB frame limit."""
    process = BrokerProcess(Path(tmp_path_factory.mktemp("strict")), {
        "allowAutoTopicCreation": "false", "maxFrameBytes": str(1 << 20),
    }).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def opaque_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker with ``validateRecords`` off: it stores batches whose records do not parse."""
    process = BrokerProcess(Path(tmp_path_factory.mktemp("opaque")),
                            {"validateRecords": "false"}).start()
    yield process
    process.stop()


def still_serving(broker: BrokerProcess) -> None:
    """A fresh connection still gets ApiVersions and Metadata answered."""
    conn = RawConnection(broker.port)
    try:
        versions = conn.call(ApiVersionsRequest[0](), 0, ApiVersionsResponse)
        assert versions.error_code == 0
        assert any(api.api_key == 0 for api in versions.api_keys)
        meta = conn.call(MetadataRequest[1](topics=None), 1, MetadataResponse)
        assert meta.brokers[0].port == broker.port
    finally:
        conn.close()


def create(conn: RawConnection, name: str, partitions: int = 1) -> int:
    topic = CreateTopicsRequest.CreatableTopic(name=name, num_partitions=partitions,
                                               replication_factor=1, assignments=[], configs=[])
    answer = conn.call(CreateTopicsRequest[5](topics=[topic], timeout_ms=5000,
                                              validate_only=False), 5, CreateTopicsResponse)
    return int(answer.topics[0].error_code)


def produce(conn: RawConnection, topic: str, records: bytes, acks: int = -1,
            partition: int = 0) -> Any:
    data = ProduceRequest.TopicProduceData(name=topic, partition_data=[
        ProduceRequest.TopicProduceData.PartitionProduceData(index=partition, records=records)])
    answer = conn.call(ProduceRequest[9](transactional_id=None, acks=acks, timeout_ms=5000,
                                         topic_data=[data]), 9, ProduceResponse)
    return answer.responses[0].partition_responses[0]


def latest_offset(conn: RawConnection, topic: str) -> int:
    part = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
        partition_index=0, current_leader_epoch=-1, timestamp=-1)
    answer = conn.call(ListOffsetsRequest[7](replica_id=-1, isolation_level=0, topics=[
        ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[part])]), 7,
        ListOffsetsResponse)
    return int(answer.topics[0].partitions[0].offset)


def test_random_bytes_as_a_frame_close_the_connection(broker: BrokerProcess) -> None:
    rng = random.Random(7)
    for _ in range(5):
        conn = RawConnection(broker.port)
        garbage = b"\x7f" + bytes(rng.getrandbits(8) for _ in range(300))
        conn.send_frame(garbage)
        assert conn.closed_by_peer()
        conn.close()
    broker.wait_for_log(r"closing connection from .*unknown or unsupported API key")
    still_serving(broker)


def test_garbage_body_behind_a_valid_header_closes_the_connection(broker: BrokerProcess) -> None:
    conn = RawConnection(broker.port)
    header = struct.pack(">hhih", 0, 9, 1, 3) + b"bad" + b"\x00"
    conn.send_frame(header + b"\xff\xff\xff\xff\x01\x02")
    assert conn.closed_by_peer()
    conn.close()
    broker.wait_for_log(r"malformed Produce v9 request")
    still_serving(broker)


def test_truncated_frame(broker: BrokerProcess) -> None:
    sock = socket.create_connection(("127.0.0.1", broker.port))
    sock.sendall(struct.pack(">i", 100) + b"\x00\x12" + b"\x00" * 48)
    sock.shutdown(socket.SHUT_WR)
    sock.settimeout(5)
    assert sock.recv(100) == b""
    sock.close()
    broker.wait_for_log(r"closed after 50 of 100 frame bytes")
    still_serving(broker)


@pytest.mark.parametrize("size", [(1 << 20) + 1, 0x7FFFFFFF, -5, 0])
def test_size_prefix_outside_the_limit_closes_at_once(strict_broker: BrokerProcess,
                                                      size: int) -> None:
    sock = socket.create_connection(("127.0.0.1", strict_broker.port))
    sock.sendall(struct.pack(">i", size))
    sock.settimeout(5)
    assert sock.recv(100) == b""  # closed before any body is read
    sock.close()
    strict_broker.wait_for_log(rf"frame size {size} outside 1\.\.{1 << 20}")
    still_serving(strict_broker)


def test_unknown_api_key_closes_the_connection(broker: BrokerProcess) -> None:
    conn = RawConnection(broker.port)
    conn.send_frame(struct.pack(">hhih", 999, 0, 42, -1))
    assert conn.closed_by_peer()
    conn.close()
    broker.wait_for_log(r"unknown or unsupported API key 999 \(correlation id 42\)")
    still_serving(broker)


@pytest.mark.parametrize("client_id", [struct.pack(">h", 3) + b"\xff\xfeA",
                                       struct.pack(">h", -2)],
                         ids=["not-utf-8", "length-minus-2"])
def test_a_client_id_kafka_reads_leniently_is_answered(broker: BrokerProcess,
                                                        client_id: bytes) -> None:
    # Kafka replaces malformed UTF-8 and reads any negative length as null
    conn = RawConnection(broker.port)
    conn.send_frame(struct.pack(">hhi", 18, 0, 7) + client_id)
    frame = conn.read_frame()
    assert struct.unpack_from(">i", frame, 0)[0] == 7
    assert ApiVersionsResponse.decode(frame[4:], version=0).error_code == 0
    conn.close()


def test_unsupported_api_versions_version_gets_v0_answer(broker: BrokerProcess) -> None:
    conn = RawConnection(broker.port)
    conn.send_frame(struct.pack(">hhih", 18, 99, 5, 1) + b"x" + b"\x00" + b"\x00\x00\x00")
    frame = conn.read_frame()
    assert struct.unpack_from(">i", frame, 0)[0] == 5
    answer = ApiVersionsResponse.decode(frame[4:], version=0)
    assert answer.error_code == UNSUPPORTED_VERSION
    assert {api.api_key for api in answer.api_keys} >= {0, 1, 2, 3, 18}
    conn.close()


def test_wrong_crc_is_corrupt_message_and_nothing_is_written(broker: BrokerProcess,
                                                             topic_name: str) -> None:
    conn = RawConnection(broker.port)
    assert create(conn, topic_name) == 0
    batch = bytearray(record_batch(3))
    batch[-1] ^= 0xFF
    answer = produce(conn, topic_name, bytes(batch))
    assert answer.error_code == CORRUPT_MESSAGE
    assert latest_offset(conn, topic_name) == 0
    good = produce(conn, topic_name, record_batch(3))
    assert (good.error_code, good.base_offset) == (0, 0)
    assert latest_offset(conn, topic_name) == 3
    conn.close()


def test_bad_batches_and_acks_get_kafka_error_codes(broker: BrokerProcess,
                                                   topic_name: str) -> None:
    conn = RawConnection(broker.port)
    assert create(conn, topic_name) == 0
    two = record_batch(2) + record_batch(2)
    assert produce(conn, topic_name, two).error_code == INVALID_RECORD
    assert produce(conn, topic_name, record_batch(2)[:40]).error_code == CORRUPT_MESSAGE
    assert produce(conn, topic_name, record_batch(2), acks=2).error_code == INVALID_REQUIRED_ACKS
    assert produce(conn, topic_name, record_batch(1), partition=7).error_code == \
        UNKNOWN_TOPIC_OR_PARTITION
    assert latest_offset(conn, topic_name) == 0
    conn.close()


def offset_for_time(conn: RawConnection, topic: str, timestamp: int) -> tuple[int, int]:
    part = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
        partition_index=0, current_leader_epoch=-1, timestamp=timestamp)
    answer = conn.call(ListOffsetsRequest[7](replica_id=-1, isolation_level=0, topics=[
        ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[part])]), 7,
        ListOffsetsResponse).topics[0].partitions[0]
    assert answer.error_code == 0, answer
    return int(answer.offset), int(answer.timestamp)


def test_a_header_claiming_more_records_than_its_bytes_hold(broker: BrokerProcess,
                                                           topic_name: str) -> None:
    """One small batch may not take up two billion offsets (records are not read, but a
    record takes at least 7 bytes)."""
    conn = RawConnection(broker.port)
    assert create(conn, topic_name) == 0
    batch = bytearray(record_batch(2))
    struct.pack_into(">i", batch, 23, 2**31 - 2)  # last offset delta
    struct.pack_into(">i", batch, 57, 2**31 - 1)  # record count
    assert produce(conn, topic_name, resealed(batch)).error_code == INVALID_RECORD
    assert latest_offset(conn, topic_name) == 0
    conn.close()


def test_timestamp_lookup_past_a_batch_whose_records_do_not_parse(
        opaque_broker: BrokerProcess, topic_name: str) -> None:
    """Without validateRecords such a batch is stored as sent; a timestamp lookup that
    lands on it answers by its header instead of failing the connection."""
    broker = opaque_broker
    conn = RawConnection(broker.port)
    assert create(conn, topic_name) == 0
    assert produce(conn, topic_name, record_batch(1, timestamp=1_000)).base_offset == 0
    spoiled = bytearray(record_batch(3, timestamp=2_000))
    spoiled[61:] = b"\xff" * (len(spoiled) - 61)
    assert produce(conn, topic_name, resealed(spoiled)).base_offset == 1
    assert produce(conn, topic_name, record_batch(1, timestamp=3_000)).base_offset == 4
    assert offset_for_time(conn, topic_name, 1_500) == (1, 2_002)  # its max timestamp
    assert offset_for_time(conn, topic_name, 2_500) == (4, 3_000)
    assert offset_for_time(conn, topic_name, -3) == (4, 3_000)  # max timestamp
    still_serving(broker)
    conn.close()


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
@pytest.mark.parametrize("payload", ["garbage", "bomb"])
def test_timestamp_lookup_past_a_compressed_batch_that_does_not_inflate(
        opaque_broker: BrokerProcess, topic_name: str, codec: int, payload: str) -> None:
    """Garbage that no codec takes, or a bomb (80 MiB of zeros in a few kB): stored as sent
    without validateRecords, looked up by its header, never inflated past 64 MiB."""
    broker = opaque_broker
    conn = RawConnection(broker.port)
    assert create(conn, topic_name) == 0
    data = bytes(range(256)) * 8 if payload == "garbage" else BOMBS[codec]()
    stored = produce(conn, topic_name, compressed_batch(codec, data))
    assert (stored.error_code, stored.base_offset) == (0, 0)
    assert offset_for_time(conn, topic_name, 0) == (0, 1_700_000_000_000)
    assert offset_for_time(conn, topic_name, -3) == (0, 1_700_000_000_000)
    still_serving(broker)
    conn.close()


def test_produce_to_missing_topic_without_auto_creation(strict_broker: BrokerProcess) -> None:
    conn = RawConnection(strict_broker.port)
    answer = produce(conn, "never-created", record_batch(1))
    assert answer.error_code == UNKNOWN_TOPIC_OR_PARTITION
    meta = conn.call(MetadataRequest[9](topics=[MetadataRequest.MetadataRequestTopic(
        name="never-created")], allow_auto_topic_creation=True), 9, MetadataResponse)
    assert meta.topics[0].error_code == UNKNOWN_TOPIC_OR_PARTITION
    assert produce(conn, "never-created", record_batch(1)).error_code == \
        UNKNOWN_TOPIC_OR_PARTITION
    conn.close()


@pytest.mark.parametrize("name", ["bad name", "a/t", "x" * 250, "..", "tenant/ns/bad$",
                                  "persistent://a/b", ""])
def test_invalid_topic_names(broker: BrokerProcess, name: str) -> None:
    conn = RawConnection(broker.port)
    assert create(conn, name) == INVALID_TOPIC_EXCEPTION
    meta = conn.call(MetadataRequest[9](topics=[MetadataRequest.MetadataRequestTopic(
        name=name)], allow_auto_topic_creation=True), 9, MetadataResponse)
    assert meta.topics[0].error_code == INVALID_TOPIC_EXCEPTION
    assert produce(conn, name, record_batch(1)).error_code == INVALID_TOPIC_EXCEPTION
    conn.close()


def test_fetch_past_the_end_is_offset_out_of_range(broker: BrokerProcess,
                                                   topic_name: str) -> None:
    conn = RawConnection(broker.port)
    assert create(conn, topic_name) == 0
    assert produce(conn, topic_name, record_batch(5)).error_code == 0

    def fetch(offset: int) -> Any:
        return conn.call(fetch_request(topic_name, offset), 11,
                         FetchResponse).responses[0].partitions[0]

    past = fetch(6)
    assert past.error_code == OFFSET_OUT_OF_RANGE
    assert past.high_watermark == 5
    at_end = fetch(5)
    assert (at_end.error_code, at_end.records) == (0, b"")
    assert fetch(0).error_code == 0
    conn.close()
    still_serving(broker)


@pytest.mark.parametrize(("magic", "code"), [(0, INVALID_RECORD), (1, INVALID_RECORD),
                                             (3, CORRUPT_MESSAGE), (-1, CORRUPT_MESSAGE)])
def test_a_batch_of_another_magic_gets_kafkas_code(broker: BrokerProcess, topic_name: str,
                                                   magic: int, code: int) -> None:
    """Produce v3 and later: a v0 or v1 batch is INVALID_RECORD (Kafka's
    ``ProduceRequest.validateRecords``), a magic byte out of 0..2 CORRUPT_MESSAGE."""
    conn = RawConnection(broker.port)
    assert create(conn, topic_name) == 0
    batch = bytearray(record_batch(2))
    struct.pack_into(">b", batch, 16, magic)
    assert produce(conn, topic_name, resealed(batch)).error_code == code
    assert latest_offset(conn, topic_name) == 0
    conn.close()


def test_an_idempotent_batch_without_a_sequence_is_invalid(broker: BrokerProcess,
                                                           topic_name: str) -> None:
    """Kafka's ``LogValidator``: a producer id with base sequence -1 is INVALID_RECORD."""
    conn = RawConnection(broker.port)
    assert create(conn, topic_name) == 0
    batch = bytearray(record_batch(2))
    struct.pack_into(">qhi", batch, 43, 7, 0, -1)  # producer id, epoch, base sequence
    answer = produce(conn, topic_name, resealed(batch))
    assert answer.error_code == INVALID_RECORD
    assert "invalid sequence number -1" in answer.error_message
    assert latest_offset(conn, topic_name) == 0
    conn.close()


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_a_compressed_batch_claiming_billions_of_records(opaque_broker: BrokerProcess,
                                                         topic_name: str, codec: int) -> None:
    """Without validateRecords nothing is inflated, yet one small compressed batch may not
    take up two billion offsets: no more records than its payload may inflate to."""
    conn = RawConnection(opaque_broker.port)
    assert create(conn, topic_name) == 0
    batch = bytearray(record_batch(2))
    struct.pack_into(">h", batch, 21, codec)
    struct.pack_into(">i", batch, 23, 2**31 - 2)  # last offset delta
    struct.pack_into(">i", batch, 57, 2**31 - 1)  # record count
    assert produce(conn, topic_name, resealed(batch)).error_code == INVALID_RECORD
    assert latest_offset(conn, topic_name) == 0
    conn.close()


def test_a_request_of_many_refused_partitions_logs_one_line(broker: BrokerProcess,
                                                            topic_name: str) -> None:
    """Each refused partition of a request was a log line of its own (100,000 bad entries,
    100,000 lines): now the request's refusals are one line, the first with its message,
    a few more named, the rest counted."""
    conn = RawConnection(broker.port)
    assert create(conn, topic_name) == 0
    batch = record_batch(1)
    data = ProduceRequest.TopicProduceData(name=topic_name, partition_data=[
        ProduceRequest.TopicProduceData.PartitionProduceData(index=index, records=batch)
        for index in range(1, 2001)])
    answer = conn.call(ProduceRequest[9](transactional_id=None, acks=-1, timeout_ms=5000,
                                         topic_data=[data]), 9, ProduceResponse)
    codes = {p.error_code for p in answer.responses[0].partition_responses}
    assert codes == {UNKNOWN_TOPIC_OR_PARTITION}
    assert produce(conn, topic_name, record_batch(1), partition=1).error_code == \
        UNKNOWN_TOPIC_OR_PARTITION  # a request of one: its own line, as before
    conn.close()
    line = broker.wait_for_log(rf"produce to {topic_name}-1 .*refused: .*and 1999 more "
                               rf"partitions: {topic_name}-2: UNKNOWN_TOPIC_OR_PARTITION, "
                               rf"{topic_name}-3: \w+, {topic_name}-4: \w+, \.\.\.\)")
    assert line
    broker.wait_for_log(rf"produce to {topic_name}-1 .*refused: [^(]*$")
    lines = [text for text in broker.log_text().splitlines() if f"produce to {topic_name}-" in text]
    assert len(lines) == 2, lines


def test_an_acks0_produce_refused_closes_the_connection(strict_broker: BrokerProcess) -> None:
    """acks=0 gets no answer, so a refused partition closes the connection (Kafka's
    ``handleProduceRequest``): the producer notices and refreshes its metadata. A good
    acks=0 produce leaves it open."""
    conn = RawConnection(strict_broker.port, timeout=10)
    try:
        assert create(conn, "acks0-topic") == 0
        cases = {"good": ("acks0-topic", 0), "unknown topic": ("acks0-missing", 0),
                 "partition out of range": ("acks0-topic", 5)}
        for case, (topic, partition) in cases.items():
            mark = len(strict_broker.lines)
            data = ProduceRequest.TopicProduceData(name=topic, partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(
                    index=partition, records=record_batch(1))])
            conn.send_frame(conn.request_bytes(ProduceRequest[9](
                transactional_id=None, acks=0, timeout_ms=5000, topic_data=[data]), 9))
            if case == "good":  # no answer to it; the next request is answered
                assert conn.call(ApiVersionsRequest[0](), 0, ApiVersionsResponse).error_code == 0
                continue
            with pytest.raises(ConnectionError):
                conn.read_frame()  # closed, before any answer
            strict_broker.wait_for_log(r"closing connection .*acks=0 produce refused for 1 "
                                       rf"partition\(s\), first {topic}-{partition}: "
                                       "UNKNOWN_TOPIC_OR_PARTITION", after=mark)
            conn.close()
            conn = RawConnection(strict_broker.port, timeout=10)
        assert latest_offset(conn, "acks0-topic") == 1
    finally:
        conn.close()
    still_serving(strict_broker)
