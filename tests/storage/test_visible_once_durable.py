"""With an fsync before every acknowledgement (``flushIntervalMessages=1``) a record is
visible to Fetch and ListOffsets only once it is fsynced, as in Kafka (``flush.messages``
flushes before the high watermark moves), so a power loss never takes back an offset a
consumer read and gives it to another record.

The engine runs in-process on real files with its real handlers. An fsync is held by
keeping the one worker thread of the event loop's executor busy until the test lets it
go (a slow disk); a power loss is a copy of the data directory taken while the fsync is
held, its ledgers cut back to the sizes they had when everything in them was fsynced.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest

from broker_core.apis.fetch import handle_fetch, release_batches
from broker_core.apis.list_offsets import handle_list_offsets
from broker_core.codec.batch_header import base_offset
from broker_core.context import Endpoint, RequestContext
from broker_core.engine import Engine
from broker_core.engine_config import EngineConfig
from broker_core.naming import Namespace
from broker_core.stages import Later
from broker_core.storage import FileRegion, LogConfig, open_storage
from broker_core.storage.cluster import BrokerRecord
from tests.batches import build_batch
from tests.txn_helpers import batch

TOPIC = "public/default/t"
STATE_TOPIC = "public/__kafka/__transaction_state"
CTX = RequestContext(listener="PLAINTEXT", advertised=Endpoint("127.0.0.1", 9092),
                     principal="User:ANONYMOUS", home=Namespace("public", "default"),
                     client_id="test", api_version=11)
_Topic = FetchRequest.FetchTopic
_Offsets = ListOffsetsRequest.ListOffsetsTopic


async def started(path: Path, topics: LogConfig | None = None) -> Engine:
    """An engine on ``path`` that fsyncs before every acknowledgement, with the topic
    (configured by ``topics``: the default)."""
    config = EngineConfig(offsets_topic_partitions=1, txn_topic_partitions=1,
                          flush_interval_messages=1, flush_interval_ms=0)
    engine = Engine(config, open_storage(path.as_uri(), topics or LogConfig()))
    engine.start()
    await engine.join(BrokerRecord(0, None, ()))
    if engine.logs.topic(TOPIC) is None:
        engine.logs.create_topic(TOPIC, 1, {})
    return engine


def produce(engine: Engine, value: bytes) -> tuple[int, asyncio.Future[None]]:
    """Append one record as Produce does: its offset and the fsync its ack awaits."""
    appended = engine.append(engine.admit(TOPIC, 0, build_batch([(None, value)]), -1))
    assert appended.durable is not None  # flushIntervalMessages=1: every ack waits
    return appended.base_offset, appended.durable


async def fetch(engine: Engine, offset: int, wait_ms: int = 0,
                committed: bool = False) -> tuple[int, int, list[int]]:
    """One Fetch of partition 0 from ``offset``: the high watermark, the last stable
    offset and the base offsets of the batches it carries."""
    request = FetchRequest[11](
        replica_id=-1, max_wait_ms=wait_ms, min_bytes=1, max_bytes=1 << 20,
        isolation_level=int(committed), session_id=0, session_epoch=-1, rack_id="",
        forgotten_topics_data=[],
        topics=[_Topic(topic="t", partitions=[_Topic.FetchPartition(
            partition=0, current_leader_epoch=-1, fetch_offset=offset, log_start_offset=-1,
            partition_max_bytes=1 << 20)])])
    answered = await handle_fetch(engine, CTX, request)
    assert isinstance(answered, Later)  # a full fetch: read in the waiting stage
    answer = await answered.wait
    part = answer.topics[0].partitions[0]
    assert part.error == 0
    offsets = [base_offset(b.head if isinstance(b, FileRegion) else b)
               for b in part.batches if isinstance(b, FileRegion | bytes | memoryview)]
    assert len(offsets) == len(part.batches)
    release_batches(part.batches)
    return part.high_watermark, part.last_stable_offset, offsets


async def latest(engine: Engine, committed: bool = False, timestamp: int = -1) -> int:
    """ListOffsets of partition 0: LATEST, or the first offset at ``timestamp``."""
    request = ListOffsetsRequest[5](replica_id=-1, isolation_level=int(committed), topics=[
        _Offsets(name="t", partitions=[_Offsets.ListOffsetsPartition(
            partition_index=0, current_leader_epoch=-1, timestamp=timestamp)])])
    answer = await handle_list_offsets(engine, CTX, request)
    part = answer.topics[0].partitions[0]
    assert part.error_code == 0
    return int(part.offset)


@contextmanager
def fsyncs_held() -> Iterator[None]:
    """Keep the executor's one worker busy (fsyncs run there) until the block ends."""
    gate = threading.Event()
    asyncio.get_running_loop().run_in_executor(None, gate.wait, 60)
    try:
        yield
    finally:
        gate.set()


def ledger_sizes(path: Path) -> dict[Path, int]:
    return {ledger.relative_to(path): ledger.stat().st_size for ledger in path.rglob("*.ledger")}


def power_loss(path: Path, copy: Path, durable: dict[Path, int]) -> None:
    """``copy``: ``path`` as a power loss leaves it, what was not fsynced (beyond the
    ``durable`` ledger sizes) gone."""
    shutil.copytree(path, copy)
    for ledger, size in durable.items():
        os.truncate(copy / ledger, min(size, (copy / ledger).stat().st_size))


async def settle_briefly() -> None:
    """Let whatever is ready run (a woken fetch answers within these turns)."""
    for _ in range(50):
        await asyncio.sleep(0)


def test_a_record_is_visible_once_fsynced(tmp_path: Path) -> None:
    """Fetch, ListOffsets (both isolation levels) and a parked long poll see a record only
    once the fsync its producer waits for is done; the last stable offset stays at or
    below the high watermark when a transaction starts in records not visible yet."""

    async def scenario() -> None:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
        engine = await started(tmp_path)
        first, durable = produce(engine, b"first")
        await durable
        assert first == 0 and await fetch(engine, 0) == (1, 1, [0])
        pid, epoch = await engine.transactions.init_producer_id(STATE_TOPIC, "tx", 60_000,
                                                                -1, -1)
        await engine.transactions.add_partitions(STATE_TOPIC, "tx", pid, epoch,
                                                 [(TOPIC, 0)])
        parked = asyncio.ensure_future(fetch(engine, 1, wait_ms=60_000))
        await settle_briefly()
        with fsyncs_held():
            second, durable = produce(engine, b"second")
            await settle_briefly()  # its fsync job is under way (held): the next waits
            txn = engine.append(engine.admit(TOPIC, 0, batch(pid, epoch, 0, 2, True), -1))
            assert (second, txn.base_offset) == (1, 2)
            await settle_briefly()
            assert not parked.done()  # not woken by a record that is not fsynced
            assert await fetch(engine, 0) == (1, 1, [0])
            assert await fetch(engine, 1) == (1, 1, [])  # past the high watermark: empty
            assert await fetch(engine, 0, committed=True) == (1, 1, [0])
            assert (await latest(engine), await latest(engine, committed=True)) == (1, 1)
            assert engine.stable_offset(TOPIC, 0) == 1  # the transaction is not visible
            # by time: the records are stamped 1,000, the transaction's now
            assert await latest(engine, timestamp=1_000) == 0
            assert await latest(engine, timestamp=1_001) == -1
        await durable
        assert txn.durable is not None
        await txn.durable
        high_watermark, _, woken = await asyncio.wait_for(parked, 30)
        assert high_watermark >= 2 and woken[0] == 1  # the second fsync may be done too
        assert await fetch(engine, 0) == (4, 2, [0, 1, 2])
        assert (await latest(engine), await latest(engine, committed=True)) == (4, 2)
        assert await latest(engine, timestamp=1_001) == 2
        await engine.stop()

    asyncio.run(scenario())


def test_no_offset_a_consumer_read_is_reused_after_a_power_loss(tmp_path: Path) -> None:
    """A consumer reads while a record's fsync is held; the power goes before it is done.
    After the restart, the records produced get offsets no consumer read before."""
    before, after = tmp_path / "before", tmp_path / "after"

    async def until_power_loss() -> set[int]:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
        engine = await started(before)
        _, durable = produce(engine, b"first")
        await durable
        fsynced = ledger_sizes(before)
        with fsyncs_held():
            produce(engine, b"second")
            _, _, read = await fetch(engine, 0)
            power_loss(before, after, fsynced)
        await engine.stop()
        return set(read)

    async def after_restart() -> set[int]:
        engine = await started(after)
        offsets = set()
        for value in (b"third", b"fourth"):
            offset, durable = produce(engine, value)
            await durable
            offsets.add(offset)
        await engine.stop()
        return offsets

    read = asyncio.run(until_power_loss())
    assert not read & asyncio.run(after_restart())  # the old code gave offset 1 again
    assert read == {0}


def test_retention_keeps_a_record_waiting_for_its_fsync(tmp_path: Path) -> None:
    """``retention.bytes=0`` empties a log, but not past its high watermark (as Kafka): a
    record whose fsync is under way, not acknowledged yet, is still there once its
    producer is told it was written (so is its segment: retention drops whole ones); the
    next round, once it is acknowledged, empties the log."""

    async def scenario() -> None:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
        engine = await started(tmp_path, LogConfig(retention_bytes=0))
        _, durable = produce(engine, b"first")
        await durable
        with fsyncs_held():
            second, durable = produce(engine, b"second")
            await settle_briefly()
            due = engine.background.due_now(engine.logs.retention_due())
            assert engine.logs.drop_retained(due) == 0  # the old code dropped the segment
        await durable
        assert await fetch(engine, 0) == (2, 2, [0, 1])
        assert engine.logs.drop_retained(
            engine.background.due_now(engine.logs.retention_due())) == 1
        log = engine.logs.partition(TOPIC, 0)
        assert log is not None and log.log_start_offset == log.next_offset == second + 1
        await engine.stop()

    asyncio.run(scenario())
