"""A transaction whose completion cannot finish holds no other transaction: the periodic
duty starts each id's work in the background and never waits for it, so a marker that its
partition's owner does not write (here a broker that holds its lease and the partition but
never serves its queue) leaves the other transactions' timeouts to abort them in the same
round; the stuck one completes once its marker is written, is started only once meanwhile,
and a coordinator that stops cancels it. While a transaction is being completed, EndTxn
asking the other end gets INVALID_TXN_STATE and its retry CONCURRENT_TRANSACTIONS, as on
Kafka (engine driven directly, on a real PostgreSQL; the other broker is a registration in
the same database)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from broker_core.cluster.placement import assign
from broker_core.engine import Engine
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.storage import Storage, open_storage
from broker_core.storage.cluster import BrokerRecord, MarkerRequest
from broker_core.transactions.coordinator import TransactionCoordinator
from broker_core.transactions.model import TxnState
from tests.coordinator_failures import (
    OFFSETS_TOPIC,
    STATE_TOPIC,
    TOPIC,
    run_engine,
    served,
    until,
)

SILENT = 1
"""The broker id of the registration that owns a partition and never writes its markers."""


def _state(txns: TransactionCoordinator, transactional_id: str) -> TxnState | None:
    txn = txns.find(STATE_TOPIC, transactional_id)
    return None if txn is None else txn.state


def _queued(storage: Storage) -> list[MarkerRequest]:
    return [request for _, request in storage.cluster.pending_markers()]


async def _open(txns: TransactionCoordinator, transactional_id: str,
                partition: int) -> tuple[int, int]:
    await served(txns, STATE_TOPIC, transactional_id)
    pid, epoch = await txns.init_producer_id(STATE_TOPIC, transactional_id, 60_000, -1, -1)
    await txns.add_partitions(STATE_TOPIC, transactional_id, pid, epoch, [(TOPIC, partition)])
    return pid, epoch


@asynccontextmanager
async def silent_owner(url: str, engine: Engine) -> AsyncIterator[tuple[Storage, int, int]]:
    """A broker registered beside ``engine`` that takes partitions and never writes a
    marker: its storage, a partition of TOPIC it owns, and one ``engine`` keeps."""
    # with the silent broker live, the coordinator topics stay with the engine, and one
    # partition of TOPIC goes to each broker
    assert assign(STATE_TOPIC, 1, (0, SILENT)) == (0,)
    assert assign(OFFSETS_TOPIC, 1, (0, SILENT)) == (0,)
    placed = assign(TOPIC, 3, (0, SILENT))
    far, near = placed.index(SILENT), placed.index(0)
    silent = open_storage(url)
    try:
        silent.cluster.register(BrokerRecord(SILENT, None, ()), 600_000)
        await until("the partition handed to the silent broker",
                    lambda: engine.leadership.serves(TOPIC, far) is None)
        assert engine.leadership.serves(TOPIC, near) is not None
        yield silent, far, near
    finally:
        silent.close()


def _serve_all(silent: Storage) -> None:
    """The silent broker writes the markers queued for it, at last."""
    silent.cluster.markers_done([marker for marker, _ in silent.cluster.pending_markers()])


def test_an_undeliverable_marker_holds_no_other_timeout() -> None:
    async def scenario(url: str, engine: Engine) -> None:
        txns = engine.transactions
        async with silent_owner(url, engine) as (silent, far, near):
            stuck_pid, _ = await _open(txns, "stuck", far)
            await _open(txns, "other", near)
            later = int(time.time() * 1000) + 120_000  # both timed out
            await asyncio.wait_for(txns.periodic(later), 30)  # it waits for no abort
            await until("the other transaction aborted",
                        lambda: _state(txns, "other") == TxnState.COMPLETE_ABORT)
            await until("the stuck transaction's marker queued", lambda: _queued(silent))
            assert _state(txns, "stuck") == TxnState.PREPARE_ABORT
            await asyncio.wait_for(txns.periodic(later), 30)  # no second completion
            [request] = _queued(silent)
            assert (request.topic, request.partition, request.producer_id,
                    request.commit) == (TOPIC, far, stuck_pid, False)
            assert _state(txns, "stuck") == TxnState.PREPARE_ABORT

            # its owner writes it: the completion under way goes on
            _serve_all(silent)
            await until("the stuck transaction aborted",
                        lambda: _state(txns, "stuck") == TxnState.COMPLETE_ABORT)
            assert not _queued(silent)

            # a coordinator that stops cancels a completion that cannot finish: the
            # transaction stays prepared, its marker queued (the next owner completes it)
            await _open(txns, "left", far)
            await asyncio.wait_for(txns.periodic(int(time.time() * 1000) + 120_000), 30)
            await until("the marker queued", lambda: _queued(silent))
            await asyncio.wait_for(txns.stop(), 30)
            assert _state(txns, "left") == TxnState.PREPARE_ABORT
            assert len(_queued(silent)) == 1

    run_engine(scenario)


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_end_txn_while_the_transaction_is_completed(commit: bool) -> None:
    """EndTxn while the transaction's end is being completed: the other end is refused at
    once with INVALID_TXN_STATE (Kafka's answer), the same end (a retry) is answered
    CONCURRENT_TRANSACTIONS until it is complete, then NONE."""
    async def scenario(url: str, engine: Engine) -> None:
        txns = engine.transactions
        async with silent_owner(url, engine) as (silent, far, _):
            pid, epoch = await _open(txns, "tx", far)
            ending = asyncio.ensure_future(
                txns.end_txn(STATE_TOPIC, "tx", pid, epoch, commit))
            await until("the marker queued", lambda: _queued(silent))
            assert _state(txns, "tx") == (TxnState.PREPARE_COMMIT if commit
                                          else TxnState.PREPARE_ABORT)
            for asked, code in ((not commit, ErrorCode.INVALID_TXN_STATE),
                                (commit, ErrorCode.CONCURRENT_TRANSACTIONS)):
                with pytest.raises(KafkaApiError) as refused:
                    await txns.end_txn(STATE_TOPIC, "tx", pid, epoch, asked)
                assert refused.value.code == code
            _serve_all(silent)
            await asyncio.wait_for(ending, 30)
            await txns.end_txn(STATE_TOPIC, "tx", pid, epoch, commit)  # a retry: NONE
            with pytest.raises(KafkaApiError) as refused:
                await txns.end_txn(STATE_TOPIC, "tx", pid, epoch, not commit)
            assert refused.value.code == ErrorCode.INVALID_TXN_STATE

    run_engine(scenario)
