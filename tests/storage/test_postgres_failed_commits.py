"""Group commits that fail, or are still under way, on the ``postgres`` engine, and what
depends on them: the idempotent producers' state (appends made between a failure, seen by
the commit's worker thread, and its answer, handled on the event loop, are judged against
what is stored, and are not forgotten while they wait for their own commit; a state
rebuilt counts the commits under way, waiting for them off the event loop), its
snapshots, and the compaction of the coordinators' topics."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from broker_core.codec.batch_header import read_header
from broker_core.engine import Engine
from broker_core.engine_config import EngineConfig
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.storage import LogConfig, open_storage
from broker_core.storage.cluster import BrokerRecord
from broker_core.storage.pg_partition import PgPartition
from broker_core.storage_faults import WriteKind
from broker_core.system_topics import SystemTopic
from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.postgres_server import shared_server
from tests.raw import RawConnection, fetch_request
from tests.storage.test_postgres_speed import _lock_waits
from tests.storage.test_storage_engines import TOPIC


def _batch(producer_id: int, sequence: int) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=producer_id, producer_epoch=0,
                                        base_sequence=sequence, batch_size=1 << 20)
    builder.append(0, timestamp=int(time.time() * 1000), key=b"k",
                   value=f"{producer_id}:{sequence}".encode(),
                   headers=[])
    return bytes(builder.build())


def _wait(condition: str, check: Callable[[], object]) -> None:
    """Block the calling thread (the event loop's: nothing else of it runs meanwhile)
    until ``check()`` holds."""
    deadline = time.monotonic() + 20
    while not check():
        assert time.monotonic() < deadline, condition
        time.sleep(0.01)


Scenario = Callable[[str, Engine, PgPartition], Awaitable[None]]


def _run(scenario: Scenario) -> None:
    """Run ``scenario`` with an engine on a database of its own, holding one topic
    (``TOPIC``) of one partition, that this broker owns."""
    url = shared_server().new_database_url()

    async def run() -> None:
        engine = Engine(EngineConfig(), open_storage(url, LogConfig()))
        engine.start()
        try:
            await engine.join(BrokerRecord(0, None, ()))
            engine.logs.create_topic(TOPIC, 1, {})
            await engine.leadership.ready([(TOPIC, 0)])
            partition = engine.partition(TOPIC, 0)
            assert isinstance(partition, PgPartition)
            await scenario(url, engine, partition)
        finally:
            await engine.stop()

    asyncio.run(run())


@contextmanager
def _row_locked(url: str, partition: PgPartition) -> Iterator[psycopg.Connection[Any]]:
    """A session holding ``partition``'s row locked (its commits wait) until it rolls
    back or the block ends."""
    with psycopg.connect(url) as locker:
        locker.execute("SELECT 1 FROM edge_partitions WHERE id = %s FOR UPDATE",
                       (partition.partition_id,))
        yield locker


async def _stored(engine: Engine, producer_id: int, sequence: int) -> int:
    """Append a batch of ``producer_id`` at ``sequence`` and await its commit; its offset."""
    appended = engine.append(engine.admit(TOPIC, 0, _batch(producer_id, sequence), -1))
    assert appended.durable is not None
    await appended.durable
    return appended.base_offset


def test_appends_made_while_a_failed_commit_is_answered_are_judged_and_kept() -> None:
    """Producer 7 has stored sequence 0; its batch of sequence 1 (A) waits for a commit
    that a row lock holds up, and that commit then fails (its connection is terminated).
    Before the event loop hears of it, two batches arrive: producer 7's sequence 2 (D)
    and producer 8's first (E). D must be refused rather than stored after a gap (what is
    stored ends at sequence 0, A is not there), with a retriable NOT_LEADER_OR_FOLLOWER,
    not OUT_OF_ORDER_SEQUENCE_NUMBER: the client sends A again first, without bumping its
    epoch (``partition_producers``, ``RESUME_GRACE_S``); E is stored,
    and its retry, arriving while E's own commit still waits, is answered as a duplicate
    of it, never stored twice."""

    async def scenario(url: str, engine: Engine, partition: PgPartition) -> None:
        await _stored(engine, 7, 0)
        with _row_locked(url, partition) as locker:
            a = engine.append(engine.admit(TOPIC, 0, _batch(7, 1), -1))
            assert a.durable is not None
            _wait("A's commit waits for the lock", lambda: _lock_waits(url))
            generation = partition.generation
            _terminate_lock_waiters(url)
            _wait("A's commit failed", lambda: partition.generation != generation)
            assert not a.durable.done()  # the event loop has not been told yet
            # a batch judged at the old generation is refused (retriable), not queued
            stale = bytearray(_batch(9, 0))
            with pytest.raises(KafkaApiError) as abandoned:
                engine.appends.append((TOPIC, 0), partition, stale, read_header(stale),
                                      WriteKind.RECORDS, generation=generation)
            assert abandoned.value.code == ErrorCode.KAFKA_STORAGE_ERROR
            with pytest.raises(KafkaApiError) as refused:
                engine.append(engine.admit(TOPIC, 0, _batch(7, 2), -1))
            assert refused.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER
            e = engine.append(engine.admit(TOPIC, 0, _batch(8, 0), -1))
            assert e.durable is not None
            with pytest.raises(OSError):
                await a.durable  # now the loop hears of A's failure
            retry = engine.append(engine.admit(TOPIC, 0, _batch(8, 0), -1))
            assert retry.base_offset == e.base_offset
            assert not e.durable.done()  # E's commit still waits for the lock
            locker.rollback()
        await e.durable
        assert retry.durable is not None
        await retry.durable
        assert engine.partition(TOPIC, 0).next_offset == e.base_offset + 1  # E once
        # producer 7 goes on from what is stored: A's retry, then D's
        assert engine.append(engine.admit(TOPIC, 0, _batch(7, 1), -1)).base_offset == 2
        assert engine.append(engine.admit(TOPIC, 0, _batch(7, 2), -1)).base_offset == 3

    _run(scenario)


def test_a_state_rebuilt_while_an_append_waits_for_its_commit_includes_it() -> None:
    """A partition's producer state is dropped (as when an append fails at once, or the
    partition moves) while producer 8's batch waits for its commit; the retry of that
    batch rebuilds the state, which waits for the commit first: the retry is a duplicate,
    stored once."""

    async def scenario(url: str, engine: Engine, partition: PgPartition) -> None:
        with _row_locked(url, partition) as locker:
            e = engine.append(engine.admit(TOPIC, 0, _batch(8, 0), -1))
            assert e.durable is not None
            _wait("E's commit waits for the lock", lambda: _lock_waits(url))
            engine.producers.invalidate(TOPIC, 0)
            threading.Timer(0.5, locker.rollback).start()  # the loop waits meanwhile
            retry = engine.append(engine.admit(TOPIC, 0, _batch(8, 0), -1))
            assert e.durable.done() or retry.durable is not None
            assert retry.base_offset == e.base_offset
        await e.durable
        assert partition.next_offset == e.base_offset + 1

    _run(scenario)


def test_a_state_from_before_a_failed_commit_is_never_snapshotted() -> None:
    """Producer 7's batch A fails its commit at offset 1; a non-idempotent batch B then
    takes offset 1 (no producer state is consulted for it). The periodic snapshot must
    not save the state that still counts A as stored at offset 1: A's retry would then be
    answered as a duplicate at B's offset, and A never stored."""

    async def scenario(url: str, engine: Engine, partition: PgPartition) -> None:
        await _stored(engine, 7, 0)
        with _row_locked(url, partition) as locker:
            a = engine.append(engine.admit(TOPIC, 0, _batch(7, 1), -1))
            assert a.base_offset == 1 and a.durable is not None
            _wait("A's commit waits for the lock", lambda: _lock_waits(url))
            _terminate_lock_waiters(url)
            with pytest.raises(OSError):
                await a.durable
            locker.rollback()
        assert await _stored(engine, -1, -1) == 1  # B
        await engine.producers.checkpoint(engine.flusher.flush)
        assert await _stored(engine, 7, 1) == 2  # A's retry: stored, after B

    _run(scenario)


def test_a_coordinator_compaction_drops_nothing_when_its_snapshot_is_not_stored() -> None:
    """A system topic's compaction appends the live state and drops what precedes it: only
    once that snapshot is committed. Its commit fails here (the database connection is
    terminated): the old records stay, and the next compaction, whose commit succeeds,
    drops them."""

    async def scenario(url: str, engine: Engine, partition: PgPartition) -> None:
        store = SystemTopic(engine.logs, engine.appends, TOPIC, 1, 1 << 20, 1 << 20)
        await store.settle(store.append(TOPIC, 0, [(b"k", b"old")]))
        with _row_locked(url, partition) as locker:
            generation = partition.generation
            store.compact(TOPIC, 0, [(b"k", b"new")])
            _wait("the snapshot's commit waits for the lock", lambda: _lock_waits(url))
            _terminate_lock_waiters(url)
            _wait("its commit failed", lambda: partition.generation != generation)
            locker.rollback()
        for _ in range(10):
            await asyncio.sleep(0.01)  # the failure's answer, and whatever follows it
        assert partition.log_start_offset == 0
        assert store.needs_compaction(TOPIC, 0)  # again at the next write
        # the commit's answer was lost: what its coordinator would do, read it again
        await store.reread(TOPIC, 0)
        assert [value for _, value in store.read(TOPIC, 0)] == [b"old"]
        store.replayed(TOPIC, 0)
        store.compact(TOPIC, 0, [(b"k", b"new")])
        deadline = time.monotonic() + 20
        while partition.log_start_offset == 0:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert [value for _, value in store.read(TOPIC, 0)] == [b"new"]

    _run(scenario)


def _terminate_lock_waiters(url: str) -> None:
    """End the sessions of ``url``'s database that wait for a lock (a group commit held
    up by a row lock): their statements fail as a database that went away."""
    with psycopg.connect(url, autocommit=True) as killer:
        for pid, _ in _lock_waits(url):
            killer.execute("SELECT pg_terminate_backend(%s)", (pid,))


@pytest.mark.parametrize("reader", ["idempotent produce", "fetch"])
def test_a_producer_state_rebuilt_behind_a_commit_under_way_holds_up_no_request(
        tmp_path: Path, reader: str) -> None:
    """A partition's producer state is rebuilt at its first idempotent batch, or its first
    fetch (for the last stable offset), and must count the partition's commits under way:
    while one waits (here for a row lock another session holds), the request waits for it
    without holding up the event loop, so other connections are answered meanwhile; once
    the lock goes both requests are answered."""
    url = shared_server().new_database_url()
    broker = BrokerProcess(tmp_path / "data", {"storageUrl": url}).start()
    plain, second, other = (RawConnection(broker.port) for _ in range(3))
    try:
        create_topic(broker.bootstrap, "held", 1)
        with psycopg.connect(url) as locker:
            locker.execute("SELECT 1 FROM edge_partitions WHERE topic = %s FOR UPDATE",
                           ("public/default/held",))
            plain.send_frame(plain.request_bytes(_produce("held", _batch(-1, -1)), 7))
            _wait("the plain batch's commit waits for the lock", lambda: _lock_waits(url))
            if reader == "fetch":
                second.send_frame(second.request_bytes(fetch_request("held", 0), 11))
            else:
                second.send_frame(second.request_bytes(_produce("held", _batch(7, 0)), 7))
            time.sleep(0.2)  # the second request reaches the broker (nothing to wait for)
            versions = other.call(ApiVersionsRequest[0](), 0, ApiVersionsResponse)
            assert versions.error_code == 0
            assert _lock_waits(url)  # answered while the commit still waited
        first = ProduceResponse[7].decode(plain.read_frame()[4:])
        assert first.responses[0].partition_responses[0].error_code == 0
        assert first.responses[0].partition_responses[0].base_offset == 0
        if reader == "fetch":
            fetched = FetchResponse[11].decode(second.read_frame()[4:])
            assert fetched.responses[0].partitions[0].error_code == 0
        else:
            produced = ProduceResponse[7].decode(second.read_frame()[4:])
            assert produced.responses[0].partition_responses[0].error_code == 0
            assert produced.responses[0].partition_responses[0].base_offset == 1
        assert broker.stop() == 0
    finally:
        for conn in (plain, second, other):
            conn.close()
        if broker.alive():
            broker.kill()


def _produce(topic: str, batch: bytes) -> ProduceRequest:
    data = ProduceRequest.TopicProduceData(name=topic, partition_data=[
        ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=batch)])
    return ProduceRequest[7](transactional_id=None, acks=-1, timeout_ms=30_000,
                             topic_data=[data])
