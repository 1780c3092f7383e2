"""A transaction caught between its PrepareCommit record and its markers by a crash is
completed when the broker starts again; a batch arriving while the coordinator replays
its state is not judged by half of it (engine driven directly, on real storage)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from broker_core.engine import Engine
from broker_core.engine_config import EngineConfig
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.storage import LogConfig, open_storage
from broker_core.storage.cluster import BrokerRecord
from broker_core.transactions.model import TxnState
from tests.txn_helpers import batch

TOPIC = "public/default/t"
STATE_TOPIC = "public/__kafka/__transaction_state"


def transactional_batch(producer_id: int, epoch: int, count: int) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True,
                                        producer_id=producer_id, producer_epoch=epoch,
                                        base_sequence=0, batch_size=1 << 20)
    for i in range(count):
        builder.append(i, timestamp=1_700_000_000_000, key=None, value=b"v%d" % i, headers=[])
    return bytes(builder.build())


def engine_at(path: Path) -> Engine:
    config = EngineConfig(offsets_topic_partitions=2, txn_topic_partitions=2,
                          flush_interval_ms=0)
    return Engine(config, open_storage(path.as_uri(), LogConfig()))


def test_prepared_commit_is_completed_at_start(tmp_path: Path) -> None:
    async def crash_mid_commit() -> None:
        engine = engine_at(tmp_path)
        engine.start()
        await engine.join(BrokerRecord(0, None, ()))
        engine.logs.create_topic(TOPIC, 1, {})
        pid, epoch = await engine.transactions.init_producer_id(STATE_TOPIC, "tx", 60_000, -1,
                                                                -1)
        await engine.transactions.add_partitions(STATE_TOPIC, "tx", pid, epoch, [(TOPIC, 0)])
        engine.append(engine.admit(TOPIC, 0, transactional_batch(pid, epoch, 3), -1))
        assert engine.stable_offset(TOPIC, 0) == 0  # open: nothing is stable
        txn = engine.transactions.find(STATE_TOPIC, "tx")
        assert txn is not None
        txn.state = TxnState.PREPARE_COMMIT  # the record is written, the markers are not
        engine.transactions.store.append(txn.topic, txn.partition, [txn.to_record()])
        await engine.transactions.stop()
        await engine.groups.stop()
        engine.logs.close()  # no markers, no producer snapshot: as after kill -9

    async def restart() -> None:
        engine = engine_at(tmp_path)
        engine.start()
        await engine.join(BrokerRecord(0, None, ()))
        for _ in range(200):
            txn = engine.transactions.find(STATE_TOPIC, "tx")
            if txn is not None and txn.state == TxnState.COMPLETE_COMMIT:
                break
            await asyncio.sleep(0.01)
        txn = engine.transactions.find(STATE_TOPIC, "tx")
        assert txn is not None and txn.state == TxnState.COMPLETE_COMMIT
        partition = engine.partition(TOPIC, 0)
        assert partition.next_offset == 4  # three records and the commit marker
        assert engine.stable_offset(TOPIC, 0) == 4
        assert engine.partition_producers(TOPIC, 0).aborted == []
        await engine.stop()

    asyncio.run(crash_mid_commit())
    asyncio.run(restart())


OTHER_IDS = 5_000
"""Records of other transactional ids between a transaction's first and last ones: the
replay of the state partition yields to the event loop every 2,000 records, so a restart
replays them over several turns of it."""


def test_a_batch_during_the_replay_is_not_judged_by_half_a_state(tmp_path: Path) -> None:
    """While a restarted broker replays ``__transaction_state``, a transactional batch of
    a transaction committed before the restart must not be let in because the replay has
    reached the transaction's Ongoing record and not yet its commit: that batch would open
    a transaction no marker ever ends (KIP-890's hanging transaction), holding back every
    read_committed reader. It is answered NOT_ENOUGH_REPLICAS (retriable, as Kafka answers
    while its coordinator loads) and stores nothing; once replayed, the coordinator's state
    refuses it."""
    key = (STATE_TOPIC, "tx")

    async def commit_before_restart() -> tuple[int, int]:
        engine = engine_at(tmp_path)
        engine.start()
        await engine.join(BrokerRecord(0, None, ()))
        engine.logs.create_topic(TOPIC, 1, {})
        assert engine.transactions.check(*key) == ErrorCode.NONE  # as the APIs ask first
        pid, epoch = await engine.transactions.init_producer_id(STATE_TOPIC, "tx", 60_000, -1,
                                                                -1)
        await engine.transactions.add_partitions(STATE_TOPIC, "tx", pid, epoch, [(TOPIC, 0)])
        for n in range(OTHER_IDS):  # all in the one state partition "tx" is in
            other = f"other-{n}"
            if engine.transactions.place(STATE_TOPIC, other) == \
                    engine.transactions.place(STATE_TOPIC, "tx"):
                await engine.transactions.init_producer_id(STATE_TOPIC, other, 60_000, -1, -1)
        engine.append(engine.admit(TOPIC, 0, transactional_batch(pid, epoch, 1), -1,
                                   txn_key=key))
        await engine.transactions.end_txn(STATE_TOPIC, "tx", pid, epoch, True)
        for _ in range(500):
            if engine.stable_offset(TOPIC, 0) == 2:
                break
            await asyncio.sleep(0.01)
        assert engine.stable_offset(TOPIC, 0) == 2  # the batch and its commit marker
        await engine.stop()
        return pid, epoch

    async def produce_during_replay(pid: int, epoch: int) -> None:
        engine = engine_at(tmp_path)
        engine.start()
        await engine.join(BrokerRecord(0, None, ()))
        late = batch(pid, epoch, 1, 1, transactional=True)  # the next sequence: no retry
        # the replay has reached the transaction's Ongoing record, not its commit
        for _ in range(10_000):
            txn = engine.transactions.find(STATE_TOPIC, "tx")
            if txn is not None:
                break
            await asyncio.sleep(0)
        assert txn is not None and txn.state == TxnState.ONGOING
        assert not engine.transactions.holds(*key)
        with pytest.raises(KafkaApiError) as refused:
            engine.append(engine.admit(TOPIC, 0, late, -1, txn_key=key))
        assert refused.value.code == ErrorCode.NOT_ENOUGH_REPLICAS
        for _ in range(1_000):
            if engine.transactions.holds(*key):
                break
            await asyncio.sleep(0.01)
        with pytest.raises(KafkaApiError) as refused:
            engine.append(engine.admit(TOPIC, 0, late, -1, txn_key=key))
        assert refused.value.code == ErrorCode.INVALID_TXN_STATE
        assert engine.partition(TOPIC, 0).next_offset == 2
        assert engine.stable_offset(TOPIC, 0) == 2
        await engine.stop()

    asyncio.run(produce_during_replay(*asyncio.run(commit_before_restart())))
