"""On ``postgres://`` DeleteRecords and retention drop a partition's rows in a worker
thread: they move the log start first, then delete the rows below it a chunk at a time,
holding the partition's lock for neither. While a chunk's DELETE waits (here for one of
its rows, locked by another session: a long statement's stand-in), the event loop serves
every other connection and fetches of that very partition (from its new log start; below
it, OFFSET_OUT_OF_RANGE), and once the drop ends the log start has moved. On a real
PostgreSQL server and a real broker."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import confluent_kafka
import psycopg
import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from kafka.protocol.admin import DeleteRecordsRequest, DeleteRecordsResponse
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from broker_core.errors import ErrorCode
from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.postgres_server import shared_server
from tests.raw import RawConnection, fetch_request
from tests.storage.pg_summaries import check_summaries
from tests.storage.test_postgres_speed import _lock_waits

TOPIC = "drops"
RECORDS = 200


@pytest.fixture()
def broker(tmp_path: Path) -> Iterator[tuple[BrokerProcess, str]]:
    url = shared_server().new_database_url()
    process = BrokerProcess(tmp_path / "data", {
        "storageUrl": url, "logRetentionCheckIntervalMs": "200"}).start()
    try:
        yield process, url
    finally:
        process.stop(30)
    check_summaries(url)


def _produce(bootstrap: str) -> None:
    """RECORDS records of 100 bytes in batches of five."""
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(RECORDS):
        producer.produce(TOPIC, value=b"x" * 100, partition=0)
        if i % 5 == 4:
            assert producer.flush(10) == 0


def _earliest(bootstrap: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tp = confluent_kafka.TopicPartition(TOPIC, 0)
    return int(admin.list_offsets({tp: confluent_kafka.admin.OffsetSpec.earliest()})[tp]
               .result(10).offset)


DELETING = "%DELETE FROM edge_entries%"


@contextmanager
def _row_locked(url: str) -> Iterator[psycopg.Connection[Any]]:
    """The partition's first entry row (which every drop here deletes) locked by another
    session until the block ends."""
    with psycopg.connect(url) as locker:
        assert locker.execute(
            "SELECT 1 FROM edge_entries WHERE base_offset = 0 AND partition_id = (SELECT id"
            " FROM edge_partitions WHERE topic LIKE %s AND partition = 0) FOR UPDATE",
            (f"%/{TOPIC}",)).fetchone()
        yield locker


def _waiting(url: str) -> set[tuple[int, object]]:
    """Wait until a drop's DELETE waits for the locked row; (backend, start) of it."""
    deadline = time.monotonic() + 30
    while not (found := _lock_waits(url, DELETING)):
        assert time.monotonic() < deadline, "no drop waited for the locked row"
        time.sleep(0.02)
    return set(found)


def _fetched(port: int, offset: int) -> tuple[int, int]:
    """A Fetch of the partition at ``offset``: (error code, bytes of records)."""
    answer = RawConnection(port, timeout=60).call(fetch_request(TOPIC, offset), 11,
                                                  FetchResponse)
    part = answer.responses[0].partitions[0]
    return int(part.error_code), len(part.records or b"")


def _served_meanwhile(port: int, url: str, waiting: set[tuple[int, object]],
                      kept: int) -> None:
    """While that statement still waits, a fetch of the partition from ``kept`` (an offset
    the drop keeps) gets its records, one from 0 (dropped) OFFSET_OUT_OF_RANGE, and another
    connection's ApiVersions its answer: the event loop is free, and the partition's lock
    is not held. (Were it held, the fetch would hold the loop until the statement ended,
    at its timeout.)"""
    error, size = _fetched(port, kept)
    answer = RawConnection(port, timeout=60).call(
        ApiVersionsRequest[3](client_software_name="t", client_software_version="1"), 3,
        ApiVersionsResponse)
    assert waiting <= set(_lock_waits(url, DELETING)), "answered only after the drop"
    assert (error, answer.error_code) == (0, 0) and size > 0
    assert _fetched(port, 0)[0] == ErrorCode.OFFSET_OUT_OF_RANGE


def _delete_records(port: int, offset: int) -> tuple[int, int]:
    request = DeleteRecordsRequest[2](topics=[DeleteRecordsRequest.DeleteRecordsTopic(
        name=TOPIC, partitions=[DeleteRecordsRequest.DeleteRecordsTopic
                                .DeleteRecordsPartition(partition_index=0, offset=offset)])],
        timeout_ms=30_000)
    answer = RawConnection(port, timeout=60).call(request, 2, DeleteRecordsResponse)
    part = answer.topics[0].partitions[0]
    return int(part.error_code), int(part.low_watermark)


def test_delete_records_waits_for_the_database_off_the_event_loop(
        broker: tuple[BrokerProcess, str]) -> None:
    process, url = broker
    create_topic(process.bootstrap, TOPIC, 1)
    _produce(process.bootstrap)
    with ThreadPoolExecutor(1) as pool, _row_locked(url) as locker:
        deleting = pool.submit(_delete_records, process.port, 50)
        _served_meanwhile(process.port, url, _waiting(url), 100)
        locker.rollback()
        assert deleting.result(60) == (0, 50)
    assert _earliest(process.bootstrap) == 50


def test_retention_waits_for_the_database_off_the_event_loop(
        broker: tuple[BrokerProcess, str]) -> None:
    process, url = broker
    create_topic(process.bootstrap, TOPIC, 1, {"segment.bytes": "2048"})
    _produce(process.bootstrap)
    assert _earliest(process.bootstrap) == 0
    with _row_locked(url) as locker:
        admin = AdminClient({"bootstrap.servers": process.bootstrap})
        resource = ConfigResource(ConfigResource.Type.TOPIC, TOPIC, incremental_configs=[
            ConfigEntry("retention.bytes", "6000",
                        incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([resource])[resource].result(10)
        _served_meanwhile(process.port, url, _waiting(url), RECORDS - 5)  # the next round's
        locker.rollback()
    deadline = time.monotonic() + 30
    while _earliest(process.bootstrap) == 0:
        assert time.monotonic() < deadline, "retention dropped nothing"
        time.sleep(0.1)
