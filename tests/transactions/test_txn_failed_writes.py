"""A ``__transaction_state`` write whose commit fails changes nothing in the coordinator's
memory but what the log holds (a commit whose answer was lost has the partition replayed;
here the commit did not happen, its backend terminated while it waited for a lock): the
client's retry writes the change again (rather than being answered from memory), so a
coordinator that replays the log after a move knows what the client was told (engine
driven directly, on a real PostgreSQL; one commit made to fail)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import pytest

from broker_core.engine import Engine
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.transactions.coordinator import TransactionCoordinator
from broker_core.transactions.model import ENDING, TxnState
from tests.coordinator_failures import (
    OFFSETS_TOPIC,
    STATE_TOPIC,
    TOPIC,
    answer_lost,
    fails,
    moved,
    run_engine,
    run_proxied,
    served,
    until,
)
from tests.pg_proxy import PgProxy

TID = "tx"
Action = Callable[[TransactionCoordinator, int, int], Awaitable[object]]
ACTIONS: dict[str, Action] = {
    "AddPartitionsToTxn": lambda txns, pid, epoch: txns.add_partitions(
        STATE_TOPIC, TID, pid, epoch, [(TOPIC, 1)]),
    "AddOffsetsToTxn": lambda txns, pid, epoch: txns.add_group(
        STATE_TOPIC, TID, pid, epoch, (OFFSETS_TOPIC, "g")),
    "EndTxn": lambda txns, pid, epoch: txns.end_txn(STATE_TOPIC, TID, pid, epoch, True),
    "InitProducerId": lambda txns, pid, epoch: txns.init_producer_id(
        STATE_TOPIC, TID, 60_000, -1, -1),
}


def _state(txns: TransactionCoordinator) -> dict[str, object]:
    txn = txns.find(STATE_TOPIC, TID)
    assert txn is not None
    document: dict[str, object] = json.loads(txn.to_record()[1])
    return document


@pytest.mark.parametrize("request_name", list(ACTIONS))
def test_a_failed_state_write_is_written_again_by_the_retry(request_name: str) -> None:
    """An open transaction (partition 0 added); the request's write fails: the state in
    memory is the one stored, the request's retry is written, and the state replayed
    after a move is the one the client was answered with."""
    action = ACTIONS[request_name]

    async def scenario(url: str, engine: Engine) -> None:
        txns = engine.transactions
        state_partition = await served(txns, STATE_TOPIC, TID)
        pid, epoch = await txns.init_producer_id(STATE_TOPIC, TID, 60_000, -1, -1)
        await txns.add_partitions(STATE_TOPIC, TID, pid, epoch, [(TOPIC, 0)])
        stored = _state(txns)
        error = await fails(url, state_partition, action(txns, pid, epoch))
        assert error.code == ErrorCode.NOT_COORDINATOR
        await served(txns, STATE_TOPIC, TID)  # replayed: the outcome was unknown
        assert _state(txns) == stored  # nothing of the failed write kept
        await action(txns, pid, epoch)  # the client's retry: written this time
        answered = _state(txns)
        assert answered != stored
        await moved(txns, STATE_TOPIC, TID)
        assert _state(txns) == answered

    run_engine(scenario)


def test_other_requests_wait_while_a_state_write_is_under_way() -> None:
    """While AddPartitionsToTxn's write waits, a request that would change the id's state
    gets CONCURRENT_TRANSACTIONS (Kafka's pending state; the client retries); one that
    asks for what is stored already is answered at once. Once the write failed, the
    retry of the first adds its partition and EndTxn commits at once: no transaction left
    prepared by a write that failed."""

    async def scenario(url: str, engine: Engine) -> None:
        txns = engine.transactions
        state_partition = await served(txns, STATE_TOPIC, TID)
        pid, epoch = await txns.init_producer_id(STATE_TOPIC, TID, 60_000, -1, -1)
        await txns.add_partitions(STATE_TOPIC, TID, pid, epoch, [(TOPIC, 0)])

        async def meanwhile() -> None:
            await txns.add_partitions(STATE_TOPIC, TID, pid, epoch, [(TOPIC, 0)])
            for concurrent in (
                    txns.add_partitions(STATE_TOPIC, TID, pid, epoch, [(TOPIC, 2)]),
                    txns.add_group(STATE_TOPIC, TID, pid, epoch, (OFFSETS_TOPIC, "g")),
                    txns.end_txn(STATE_TOPIC, TID, pid, epoch, True),
                    txns.init_producer_id(STATE_TOPIC, TID, 60_000, pid, epoch)):
                with pytest.raises(KafkaApiError) as refused:
                    await concurrent
                assert refused.value.code == ErrorCode.CONCURRENT_TRANSACTIONS

        await fails(url, state_partition,
                    txns.add_partitions(STATE_TOPIC, TID, pid, epoch, [(TOPIC, 1)]), meanwhile)
        await served(txns, STATE_TOPIC, TID)
        await txns.add_partitions(STATE_TOPIC, TID, pid, epoch, [(TOPIC, 1)])
        txn = txns.find(STATE_TOPIC, TID)
        assert txn is not None and txn.partitions == {(TOPIC, 0), (TOPIC, 1)}
        await txns.end_txn(STATE_TOPIC, TID, pid, epoch, True)
        assert txn.state == TxnState.COMPLETE_COMMIT
        for partition in (0, 1):  # the commit marker
            assert engine.partition(TOPIC, partition).next_offset == 1
        assert engine.partition(TOPIC, 2).next_offset == 0

    run_engine(scenario)


def test_end_txn_waits_while_a_state_write_is_under_way_whatever_the_state() -> None:
    """EndTxn while a state change of the id is being written is answered
    CONCURRENT_TRANSACTIONS before its state is looked at, as Kafka answers while a
    transition is pending: here the retry of a commit already complete (else NONE) and
    an abort of it (else INVALID_TXN_STATE), while an InitProducerId bump waits."""

    async def scenario(url: str, engine: Engine) -> None:
        txns = engine.transactions
        state_partition = await served(txns, STATE_TOPIC, TID)
        pid, epoch = await txns.init_producer_id(STATE_TOPIC, TID, 60_000, -1, -1)
        await txns.add_partitions(STATE_TOPIC, TID, pid, epoch, [(TOPIC, 0)])
        await txns.end_txn(STATE_TOPIC, TID, pid, epoch, True)

        async def meanwhile() -> None:
            for commit in (True, False):
                with pytest.raises(KafkaApiError) as refused:
                    await txns.end_txn(STATE_TOPIC, TID, pid, epoch, commit)
                assert refused.value.code == ErrorCode.CONCURRENT_TRANSACTIONS

        await fails(url, state_partition,
                    txns.init_producer_id(STATE_TOPIC, TID, 60_000, pid, epoch), meanwhile)
        await served(txns, STATE_TOPIC, TID)
        await txns.end_txn(STATE_TOPIC, TID, pid, epoch, True)  # nothing written: NONE
        with pytest.raises(KafkaApiError) as refused:
            await txns.end_txn(STATE_TOPIC, TID, pid, epoch, False)
        assert refused.value.code == ErrorCode.INVALID_TXN_STATE

    run_engine(scenario)


@pytest.mark.parametrize("request_name", list(ACTIONS))
def test_a_state_write_whose_answer_is_lost_is_served_as_stored(request_name: str) -> None:
    """An open transaction (partition 0 added); the request's write is committed but its
    answer lost: the request is answered NOT_COORDINATOR, yet the new state is stored.
    Meanwhile the id's requests get COORDINATOR_LOAD_IN_PROGRESS; then the coordinator
    serves the state as stored (an EndTxn's prepared state is completed, as after a move),
    not the one from before on which later writes would build."""
    action = ACTIONS[request_name]

    async def scenario(url: str, proxy: PgProxy, engine: Engine) -> None:
        txns = engine.transactions
        await served(txns, STATE_TOPIC, TID)
        pid, epoch = await txns.init_producer_id(STATE_TOPIC, TID, 60_000, -1, -1)
        await txns.add_partitions(STATE_TOPIC, TID, pid, epoch, [(TOPIC, 0)])
        before = _state(txns)

        async def meanwhile() -> None:
            assert txns.check(STATE_TOPIC, TID) == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS

        answered = await answer_lost(url, proxy, STATE_TOPIC, action(txns, pid, epoch),
                                     meanwhile)
        assert isinstance(answered, KafkaApiError)
        assert answered.code == ErrorCode.NOT_COORDINATOR
        await served(txns, STATE_TOPIC, TID)
        await until("no transaction left prepared", lambda: _settled(txns))
        replayed = _state(txns)
        assert replayed != before  # the write's state (or, prepared, its completion)
        await moved(txns, STATE_TOPIC, TID)
        await until("no transaction left prepared", lambda: _settled(txns))
        assert _state(txns) == replayed

    run_proxied(scenario)


def _settled(txns: TransactionCoordinator) -> bool:
    txn = txns.find(STATE_TOPIC, TID)
    return txn is not None and txn.state not in ENDING
