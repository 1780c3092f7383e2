"""A producer whose epoch is nearly exhausted (32766, as InitProducerId hands out after
many sessions) and whose transaction is aborted by a fence (its timeout, or a new
session): the abort markers end that producer id's transaction, so the last stable
offset moves past it and its pending consumer offsets are dropped; only the next session
gets a new producer id (Kafka's prepareFenceProducerEpoch keeps the id, raising the epoch
to at most 32767; the next InitProducerId rotates it). Engine driven directly, on real
storage."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from broker_core.errors import ErrorCode
from broker_core.groups.offsets import OffsetToCommit
from broker_core.storage.cluster import BrokerRecord
from broker_core.transactions.model import TxnState
from tests.transactions.test_txn_recovery import (
    STATE_TOPIC,
    TOPIC,
    engine_at,
    transactional_batch,
)

OFFSETS_TOPIC = "public/__kafka/__consumer_offsets"
GROUP = "g"


@pytest.mark.parametrize("fence", ["timeout", "new session"])
def test_a_fence_at_the_last_epochs_ends_the_open_transaction(tmp_path: Path,
                                                               fence: str) -> None:
    key = (STATE_TOPIC, "tx")

    async def scenario() -> None:
        engine = engine_at(tmp_path)
        engine.start()
        await engine.join(BrokerRecord(0, None, ()))
        engine.logs.create_topic(TOPIC, 1, {})
        assert engine.transactions.check(*key) == ErrorCode.NONE
        await engine.transactions.init_producer_id(STATE_TOPIC, "tx", 60_000, -1, -1)
        txn = engine.transactions.find(*key)
        assert txn is not None
        worn = txn.copy()
        worn.epoch = 32765  # as after 32,765 sessions
        await engine.transactions._write(txn, worn)
        pid, epoch = await engine.transactions.init_producer_id(STATE_TOPIC, "tx", 60_000, -1,
                                                                -1)
        assert epoch == 32766
        await engine.transactions.add_partitions(STATE_TOPIC, "tx", pid, epoch, [(TOPIC, 0)])
        engine.append(engine.admit(TOPIC, 0, transactional_batch(pid, epoch, 3), -1,
                                   txn_key=key))
        for _ in range(500):
            if engine.groups.serving_error(OFFSETS_TOPIC, GROUP) == ErrorCode.NONE:
                break
            await asyncio.sleep(0.01)
        await engine.transactions.add_group(STATE_TOPIC, "tx", pid, epoch,
                                            (OFFSETS_TOPIC, GROUP))
        await engine.groups.txn_commit(OFFSETS_TOPIC, GROUP, pid, "", None, -1,
                                       [OffsetToCommit(TOPIC, 0, 3, -1, "")])
        assert engine.stable_offset(TOPIC, 0) == 0  # open

        if fence == "timeout":
            await asyncio.gather(*engine.transactions.expire(int(time.time() * 1000) + 120_000))
            txn = engine.transactions.find(*key)
            assert txn is not None
            assert (txn.producer_id, txn.epoch, txn.state) == \
                (pid, 32767, TxnState.COMPLETE_ABORT)
        else:
            new_pid, new_epoch = await engine.transactions.init_producer_id(
                STATE_TOPIC, "tx", 60_000, -1, -1)
            assert new_pid != pid and new_epoch == 0  # the next session rotates the id
        for _ in range(500):  # the markers are written
            if engine.stable_offset(TOPIC, 0) == 4:
                break
            await asyncio.sleep(0.01)
        assert engine.partition(TOPIC, 0).next_offset == 4  # three records, the marker
        assert engine.stable_offset(TOPIC, 0) == 4
        assert engine.partition_producers(TOPIC, 0).aborted == [(pid, 0, 3)]
        assert engine.groups.unstable(OFFSETS_TOPIC, GROUP) == set()
        assert engine.groups.committed(OFFSETS_TOPIC, GROUP, None) == {}
        await engine.stop()

    asyncio.run(scenario())
