"""A transaction caught between its PrepareCommit record and its markers by a crash is
completed when the broker starts again (engine driven directly, on real storage)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kafka.record.default_records import DefaultRecordBatchBuilder

from broker_core.engine import Engine
from broker_core.engine_config import EngineConfig
from broker_core.storage import LogConfig, open_storage
from broker_core.storage.cluster import BrokerRecord
from broker_core.transactions.model import TxnState

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
