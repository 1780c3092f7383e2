"""On ``postgres://`` DeleteRecords and retention drop a partition's rows in a worker
thread: while the drop's transaction waits (here for the partition's row, locked by
another session), the event loop serves every other connection, and once it commits the
log start has moved. On a real PostgreSQL server and a real broker."""

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
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.postgres_server import shared_server
from tests.raw import RawConnection
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


@contextmanager
def _row_locked(url: str) -> Iterator[psycopg.Connection[Any]]:
    """The partition's row locked by another session until the block ends."""
    with psycopg.connect(url) as locker:
        assert locker.execute("SELECT 1 FROM edge_partitions WHERE topic LIKE %s AND"
                              " partition = 0 FOR UPDATE", (f"%/{TOPIC}",)).fetchone()
        yield locker


def _waiting(url: str) -> set[tuple[int, object]]:
    """Wait until a drop's statement waits for the locked row; (backend, start) of it."""
    deadline = time.monotonic() + 30
    while not (found := _lock_waits(url, "%FOR UPDATE%")):
        assert time.monotonic() < deadline, "no drop waited for the partition's row"
        time.sleep(0.02)
    return set(found)


def _served_meanwhile(port: int, url: str, waiting: set[tuple[int, object]]) -> None:
    """Another connection's ApiVersions is answered while that statement still waits: the
    event loop is free. (Were the drop on the loop, the answer would come only once the
    statement ended, at its timeout.)"""
    answer = RawConnection(port, timeout=60).call(
        ApiVersionsRequest[3](client_software_name="t", client_software_version="1"), 3,
        ApiVersionsResponse)
    assert answer.error_code == 0
    assert waiting <= set(_lock_waits(url, "%FOR UPDATE%")), "answered only after the drop"


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
        _served_meanwhile(process.port, url, _waiting(url))
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
        _served_meanwhile(process.port, url, _waiting(url))  # the next round's drop
        locker.rollback()
    deadline = time.monotonic() + 30
    while _earliest(process.bootstrap) == 0:
        assert time.monotonic() < deadline, "retention dropped nothing"
        time.sleep(0.1)
