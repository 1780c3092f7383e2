"""Transactional batches on a cluster are verified against their transaction coordinator,
also when that is another broker than the partition's leader (KIP-890 part 1): a batch for
a partition its transaction never added, or under another transactional id's producer id,
is refused and stores nothing; a verified transaction is read from the database once per
partition, not once per batch; a refused batch costs one statement, whatever transactional
id it names; real clients' transactions across brokers commit as before."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import confluent_kafka
import pytest
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from tests.cluster.test_cluster import create
from tests.cluster_helpers import Cluster
from tests.operations.test_metrics import sample, scrape
from tests.ports import free_port
from tests.raw import RawConnection
from tests.txn_helpers import (
    INVALID_PRODUCER_ID_MAPPING,
    INVALID_TXN_STATE,
    NONE,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    TxnConnection,
    batch,
    read_all,
    wait_until,
)

PARTITIONS = 4
NOT_COORDINATOR = 16
VERIFICATIONS = r'kop_server_txn_verifications_total\{outcome="verified"\}'
OTHERS = 150
"""Records of other transactional ids written after the one a test looks up (pages of 64)."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two brokers, each with a metrics port of its own; one ``__transaction_state``
    partition, so that every transactional id's state lies in the same one (and a leader
    reads back past other ids' records to find one)."""
    started = _metered(tmp_path_factory.mktemp("txn-verify"))
    try:
        yield started.start()
    finally:
        started.stop()


def _metered(root: Path, **settings: str) -> Cluster:
    """The cluster of this module's tests, not started yet."""
    cluster = Cluster(root, 2, {"kafkaTxnLogTopicNumPartitions": "1", **settings})
    for broker in cluster.brokers:
        broker.settings["metricsPort"] = str(free_port())
    return cluster


def _leaders(cluster: Cluster, topic: str) -> dict[int, int]:
    found: dict[int, int] = {}

    def agreed() -> bool:
        found.update(cluster.agreed_leaders(topic) or {})
        return len(found) == PARTITIONS

    wait_until(agreed, 60, "the brokers to agree on the leaders")
    return found


def _named_coordinator(port: int, transactional_id: str) -> int:
    """The coordinator the broker on ``port`` names (-1 while it cannot)."""
    conn = RawConnection(port)
    try:
        answer = conn.call(FindCoordinatorRequest[3](key=transactional_id, key_type=1), 3,
                           FindCoordinatorResponse)
    finally:
        conn.close()
    return int(answer.node_id) if answer.error_code == NONE else -1


def _coordinator(cluster: Cluster, transactional_id: str) -> int:
    """The broker coordinating the id, once every broker names the same one and it serves
    the id (its InitProducerId answers: partitions may still move just after a start)."""
    found: list[int] = []

    def settled() -> bool:
        named = {_named_coordinator(broker.port, transactional_id)
                 for broker in cluster.brokers if broker.alive()}
        if len(named) != 1 or -1 in named:
            return False
        (node,) = named
        conn = TxnConnection(cluster.by_id(node).port)
        try:
            if conn.init_pid(transactional_id).error_code != NONE:
                return False
        finally:
            conn.close()
        found.append(node)
        return True

    wait_until(settled, 60, f"a coordinator of {transactional_id}", interval=0.2)
    return found[-1]


def _elsewhere(cluster: Cluster, topic: str, name: str) -> tuple[str, int, int, int]:
    """A transactional id whose coordinator is not the leader of one of the topic's
    partitions: (id, partition, leader id, coordinator id)."""
    tid, partitions, leader, coordinator = _away(cluster, topic, name, 1)
    return tid, partitions[0], leader, coordinator


def _away(cluster: Cluster, topic: str, name: str,
          count: int) -> tuple[str, list[int], int, int]:
    """A transactional id whose coordinator is not the leader of ``count`` of the topic's
    partitions, all led by one broker: (id, those partitions, leader id, coordinator id)."""
    leaders = _leaders(cluster, topic)
    for n in itertools.count():
        tid = f"{topic}-{name}-{n}"
        coordinator = _coordinator(cluster, tid)
        for leader in sorted(set(leaders.values()) - {coordinator}):
            led = sorted(p for p, at in leaders.items() if at == leader)
            if len(led) >= count:
                return tid, led[:count], leader, coordinator
    raise AssertionError("unreachable")


@contextmanager
def _apart(cluster: Cluster, topic: str, name: str
           ) -> Iterator[tuple[str, int, int, TxnConnection, TxnConnection]]:
    """The topic created, and a transactional id whose coordinator does not lead one of
    its partitions (:func:`_elsewhere`): (id, partition, the leader's broker id, a
    connection to the coordinator, one to the leader), closed after."""
    create(cluster.bootstrap, topic, PARTITIONS)
    tid, partition, leader, coordinator = _elsewhere(cluster, topic, name)
    at_coordinator = TxnConnection(cluster.by_id(coordinator).port, timeout=60)
    at_leader = TxnConnection(cluster.by_id(leader).port, timeout=60)
    try:
        yield tid, partition, leader, at_coordinator, at_leader
    finally:
        at_coordinator.close()
        at_leader.close()


def _verifications(cluster: Cluster, broker_id: int) -> float:
    """How many batches the broker verified by a read of another broker's coordinator
    state."""
    samples = scrape(int(cluster.by_id(broker_id).settings["metricsPort"]))
    return sum(value for key, value in samples.items() if re.fullmatch(VERIFICATIONS, key))


def test_a_batch_for_a_partition_never_added_is_refused(cluster: Cluster,
                                                        topic_name: str) -> None:
    """The "hanging transaction" of KIP-890: a transactional batch sent to the leader
    without AddPartitionsToTxn would hold back read_committed readers until an admin
    aborted it. The leader asks the coordinator's state and refuses it."""
    with _apart(cluster, topic_name, "hang") as (tid, partition, _leader,
                                                        at_coordinator, at_leader):
        pid, epoch = at_coordinator.init_ok(tid)
        code, _ = at_leader.produce(topic_name, batch(pid, epoch, 0, 3, transactional=True),
                                    partition, transactional_id=tid)
        assert code == INVALID_TXN_STATE
        # an open transaction of another partition does not let it in either
        other = next(p for p in range(PARTITIONS) if p != partition)
        assert at_coordinator.add_partitions(tid, pid, epoch, {topic_name: [other]}) == {
            (topic_name, other): NONE}
        code, _ = at_leader.produce(topic_name, batch(pid, epoch, 0, 3, transactional=True),
                                    partition, transactional_id=tid)
        assert code == INVALID_TXN_STATE
        assert at_leader.list_offset(topic_name, partition, READ_UNCOMMITTED) == 0
        described = at_leader.describe_producers(topic_name, [partition])
        assert described.topics[0].partitions[0].active_producers == []
        assert at_coordinator.end_txn(tid, pid, epoch, False) == NONE


def test_a_batch_under_another_transactional_ids_producer_is_refused(
        cluster: Cluster, topic_name: str) -> None:
    """A client may write for its own transactional id only: the producer id of another
    one (whose transaction added the partition) is refused, and nothing is stored."""
    create(cluster.bootstrap, topic_name, PARTITIONS)
    victim, partition, leader, coordinator = _elsewhere(cluster, topic_name, "victim")
    mine = f"{topic_name}-mine"
    at_coordinator = TxnConnection(cluster.by_id(coordinator).port, timeout=60)
    at_leader = TxnConnection(cluster.by_id(leader).port, timeout=60)
    at_mine = TxnConnection(cluster.by_id(_coordinator(cluster, mine)).port, timeout=60)
    try:
        pid, epoch = at_coordinator.init_ok(victim)
        at_mine.init_ok(mine)
        assert at_coordinator.add_partitions(victim, pid, epoch, {topic_name: [partition]}) \
            == {(topic_name, partition): NONE}
        code, _ = at_leader.produce(topic_name, batch(pid, epoch, 0, 2, transactional=True),
                                    partition, transactional_id=mine)
        assert code == INVALID_PRODUCER_ID_MAPPING
        code, _ = at_leader.produce(topic_name, batch(pid, epoch, 0, 2, transactional=True),
                                    partition, transactional_id=f"{topic_name}-never")
        assert code == INVALID_PRODUCER_ID_MAPPING
        assert at_leader.list_offset(topic_name, partition, READ_UNCOMMITTED) == 0
        # the victim's own batch goes in, and a retry naming another id is refused still
        # (the verification kept for the partition is the victim's)
        code, _ = at_leader.produce(topic_name, batch(pid, epoch, 0, 2, transactional=True,
                                                      prefix="victim"),
                                    partition, transactional_id=victim)
        assert code == NONE
        code, _ = at_leader.produce(topic_name, batch(pid, epoch, 2, 2, transactional=True),
                                    partition, transactional_id=mine)
        assert code == INVALID_PRODUCER_ID_MAPPING
        assert at_coordinator.end_txn(victim, pid, epoch, True) == NONE
        wait_until(lambda: at_leader.list_offset(topic_name, partition, READ_COMMITTED) == 3,
                   30, "the commit marker")
        assert at_leader.committed_values(topic_name, partition) == [b"victim-0", b"victim-1"]
    finally:
        at_coordinator.close()
        at_leader.close()
        at_mine.close()


def test_a_transaction_is_verified_once_per_partition(cluster: Cluster,
                                                      topic_name: str) -> None:
    """The first batch of a transaction on a partition is verified with one read of the
    coordinator's state; the next ones are not read again. Once the transaction ends the
    next one's first batch is verified again: without AddPartitionsToTxn it is refused."""
    with _apart(cluster, topic_name, "once") as (tid, partition, leader,
                                                        at_coordinator, at_leader):
        pid, epoch = at_coordinator.init_ok(tid)
        assert at_coordinator.add_partitions(tid, pid, epoch, {topic_name: [partition]}) == {
            (topic_name, partition): NONE}
        before = _verifications(cluster, leader)
        for sequence in range(0, 10, 2):
            code, offset = at_leader.produce(
                topic_name, batch(pid, epoch, sequence, 2, transactional=True), partition,
                transactional_id=tid)
            assert (code, offset) == (NONE, sequence)
        assert _verifications(cluster, leader) == before + 1
        assert at_coordinator.end_txn(tid, pid, epoch, True) == NONE
        wait_until(lambda: at_leader.list_offset(topic_name, partition, READ_COMMITTED) == 11,
                   30, "the commit marker")
        code, _ = at_leader.produce(topic_name, batch(pid, epoch, 10, 2, transactional=True),
                                    partition, transactional_id=tid)
        assert code == INVALID_TXN_STATE
        assert at_leader.list_offset(topic_name, partition, READ_UNCOMMITTED) == 11


def test_a_requests_partitions_are_verified_by_one_read(cluster: Cluster,
                                                        topic_name: str) -> None:
    """A request carrying a transaction's first batches on several partitions led away
    from its coordinator is verified with one read of the coordinator's state, not one per
    partition (Kafka verifies a request's partitions in one round trip too); each partition
    is answered for itself: one the transaction did not add is refused INVALID_TXN_STATE
    and stores nothing, the others are stored."""
    create(cluster.bootstrap, topic_name, PARTITIONS)
    tid, partitions, leader, coordinator = _away(cluster, topic_name, "together", 2)
    at_coordinator = TxnConnection(cluster.by_id(coordinator).port, timeout=60)
    at_leader = TxnConnection(cluster.by_id(leader).port, timeout=60)
    try:
        pid, epoch = at_coordinator.init_ok(tid)
        # the leader's first lookup in the state partition may read all of it: done here
        code, _ = at_leader.produce(topic_name, batch(pid, epoch, 0, 1, transactional=True),
                                    partitions[0], transactional_id=f"{topic_name}-unknown")
        assert code == INVALID_PRODUCER_ID_MAPPING
        assert at_coordinator.add_partitions(tid, pid, epoch, {topic_name: partitions}) == {
            (topic_name, p): NONE for p in partitions}
        before, verified = _lookups(cluster, leader), _verifications(cluster, leader)
        answers = at_leader.produce_many(topic_name, {
            p: batch(pid, epoch, 0, 2, transactional=True) for p in partitions}, tid)
        assert answers == {p: (NONE, 0) for p in partitions}
        assert _lookups(cluster, leader)[0] - before[0] == 1
        assert _verifications(cluster, leader) == verified + len(partitions)
        assert at_coordinator.end_txn(tid, pid, epoch, True) == NONE

        # the next transaction adds one of them only
        first, *others = partitions
        assert at_coordinator.add_partitions(tid, pid, epoch, {topic_name: [first]}) == {
            (topic_name, first): NONE}
        before = _lookups(cluster, leader)
        answers = at_leader.produce_many(topic_name, {
            p: batch(pid, epoch, 2, 1, transactional=True) for p in partitions}, tid)
        assert answers[first] == (NONE, 3)  # after the batch and the commit marker
        assert all(answers[p][0] == INVALID_TXN_STATE for p in others), answers
        assert _lookups(cluster, leader)[0] - before[0] == 1
        assert at_coordinator.end_txn(tid, pid, epoch, False) == NONE
        for p in others:
            wait_until(lambda p=p: at_leader.list_offset(topic_name, p, READ_COMMITTED) == 3,
                       30, "the first transaction's marker")
            assert at_leader.list_offset(topic_name, p, READ_UNCOMMITTED) == 3
    finally:
        at_coordinator.close()
        at_leader.close()


def test_verify_only_is_answered_by_the_coordinator_alone(cluster: Cluster,
                                                           topic_name: str) -> None:
    """AddPartitionsToTxn's verify_only (version 4, what one broker asks another) is
    answered from the coordinator's state: the coordinator says which partitions the
    transaction holds; another broker, which does not hold the id's state, answers
    NOT_COORDINATOR for each (as Kafka), not a verdict from a state it does not have."""
    with _apart(cluster, topic_name, "asks") as (tid, partition, _leader,
                                                 at_coordinator, at_leader):
        pid, epoch = at_coordinator.init_ok(tid)
        other = next(p for p in range(PARTITIONS) if p != partition)
        assert at_coordinator.add_partitions(tid, pid, epoch, {topic_name: [partition]}) == {
            (topic_name, partition): NONE}
        asked = {topic_name: [partition, other]}
        assert at_coordinator.add_partitions(tid, pid, epoch, asked, 4, verify_only=True) == {
            (topic_name, partition): NONE, (topic_name, other): INVALID_TXN_STATE}
        assert at_leader.add_partitions(tid, pid, epoch, asked, 4, verify_only=True) == {
            (topic_name, partition): NOT_COORDINATOR, (topic_name, other): NOT_COORDINATOR}
        assert at_coordinator.end_txn(tid, pid, epoch, False) == NONE


def test_a_state_written_long_before_is_found(cluster: Cluster, topic_name: str) -> None:
    """The leader reads the coordinator's records newest first, page after page: an id
    whose last record lies behind many of other ids is found, and one that has none is
    known to have none once every record was read."""
    with _apart(cluster, topic_name, "old") as (tid, partition, _leader,
                                                        at_coordinator, at_leader):
        pid, epoch = at_coordinator.init_ok(tid)
        assert at_coordinator.add_partitions(tid, pid, epoch, {topic_name: [partition]}) == {
            (topic_name, partition): NONE}
        for n in range(OTHERS):  # records of other ids after it
            at_coordinator.init_ok(f"{topic_name}-other-{n}")
        code, _ = at_leader.produce(topic_name, batch(pid, epoch, 0, 1, transactional=True),
                                    partition, transactional_id=tid)
        assert code == NONE
        code, _ = at_leader.produce(topic_name, batch(pid, epoch, 1, 1, transactional=True),
                                    partition, transactional_id=f"{topic_name}-unknown")
        assert code == INVALID_PRODUCER_ID_MAPPING
        assert at_coordinator.end_txn(tid, pid, epoch, False) == NONE


def _lookups(cluster: Cluster, broker_id: int) -> tuple[float, float]:
    """The statements and batches the broker read of other brokers' coordinator states."""
    samples = scrape(int(cluster.by_id(broker_id).settings["metricsPort"]))
    return (sample(samples, "kop_server_state_lookup_statements_total"),
            sample(samples, "kop_server_state_lookup_batches_total"))


def test_refusals_cost_one_statement_whatever_the_id(cluster: Cluster,
                                                     topic_name: str) -> None:
    """What a refused batch costs the leader is bounded, whatever transactional id the
    request names: an id with no state (read back to the log start to know it: once), an
    id whose state lies behind many other ids' records. The partition's batches are read
    once; each later request reads one statement of what was written since, and the one
    batch of the id's newest record."""
    with _apart(cluster, topic_name, "cost") as (tid, partition, leader,
                                                        at_coordinator, at_leader):
        pid, epoch = at_coordinator.init_ok(tid)
        for n in range(OTHERS):
            at_coordinator.init_ok(f"{topic_name}-other-{n}")
        named = [f"{topic_name}-unknown"] * 4 + [f"{topic_name}-unknown-{n}" for n in range(4)]
        costs: list[tuple[float, float]] = []
        for name in named + [tid] * 4:
            before = _lookups(cluster, leader)
            code, _ = at_leader.produce(topic_name, batch(pid, epoch, 0, 1, transactional=True),
                                        partition, transactional_id=name)
            assert code == (INVALID_TXN_STATE if name == tid else INVALID_PRODUCER_ID_MAPPING)
            after = _lookups(cluster, leader)
            costs.append((after[0] - before[0], after[1] - before[1]))
        # the first may read the whole partition (unless an earlier test's lookup did);
        # every later one, one statement: the records written since (none, or a few of a
        # coordinator's own duties) and the id's batch
        assert costs[0][0] >= 1
        assert all(statements == 1 and batches <= 3 for statements, batches in costs[1:]), \
            costs
        assert at_leader.list_offset(topic_name, partition, READ_UNCOMMITTED) == 0


def test_a_dead_coordinator_does_not_stop_the_verification(tmp_path: Path,
                                                         topic_name: str) -> None:
    """The leader reads the coordinator's durable state, not the coordinator: with the
    coordinator killed mid-transaction (and before its partitions move: a long session
    timeout), the transaction's first batch on the leader's partition is verified and
    stored; the coordinator's next owner (the leader) commits it from the same state."""
    cluster = _metered(tmp_path, brokerSessionTimeoutMs="8000").start()
    try:
        create(cluster.bootstrap, topic_name, PARTITIONS)
        tid, partition, leader, coordinator = _elsewhere(cluster, topic_name, "dies")
        at_coordinator = TxnConnection(cluster.by_id(coordinator).port, timeout=60)
        pid, epoch = at_coordinator.init_ok(tid)
        assert at_coordinator.add_partitions(tid, pid, epoch, {topic_name: [partition]}) \
            == {(topic_name, partition): NONE}
        at_coordinator.close()
        cluster.by_id(coordinator).kill()
        at_leader = TxnConnection(cluster.by_id(leader).port, timeout=60)
        try:
            before = _verifications(cluster, leader)
            for sequence in range(2):
                code, _ = at_leader.produce(
                    topic_name, batch(pid, epoch, sequence, 1, transactional=True,
                                      prefix="kept"), partition, transactional_id=tid)
                assert code == NONE
            assert _verifications(cluster, leader) == before + 1
            wait_until(lambda: at_leader.end_txn(tid, pid, epoch, True) == NONE, 60,
                       "the coordinator's next owner to commit")
            wait_until(lambda: at_leader.list_offset(topic_name, partition,
                                                     READ_COMMITTED) == 3, 30, "the marker")
            assert at_leader.committed_values(topic_name, partition) == [b"kept-0", b"kept-1"]
        finally:
            at_leader.close()
    finally:
        cluster.stop()


def test_confluent_transactions_across_brokers(cluster: Cluster, topic_name: str) -> None:
    """librdkafka's transactions over partitions of both brokers (the coordinator leads
    some, the other broker the rest): committed ones are read by read_committed readers,
    aborted ones are not."""
    create(cluster.bootstrap, topic_name, PARTITIONS)
    leaders = _leaders(cluster, topic_name)
    tid = f"{topic_name}-confluent"
    coordinator = _coordinator(cluster, tid)
    elsewhere = [p for p, leader in leaders.items() if leader != coordinator]
    assert elsewhere and len(elsewhere) < PARTITIONS, leaders
    other = leaders[elsewhere[0]]
    before = _verifications(cluster, other)
    producer = confluent_kafka.Producer({
        "bootstrap.servers": cluster.bootstrap, "transactional.id": tid})
    producer.init_transactions(60)
    for txn in range(3):
        producer.begin_transaction()
        for partition in range(PARTITIONS):
            for i in range(5):
                producer.produce(topic_name, f"t{txn}-p{partition}-{i}".encode(),
                                 partition=partition)
        assert producer.flush(60) == 0  # every batch written (an abort purges unsent ones)
        if txn == 1:
            producer.abort_transaction(60)
        else:
            producer.commit_transaction(60)
    ends: dict[int, int] = {}
    for partition, leader in leaders.items():
        conn = TxnConnection(cluster.by_id(leader).port)
        try:
            ends[partition] = conn.list_offset(topic_name, partition, READ_COMMITTED)
        finally:
            conn.close()
    assert ends == {partition: 3 * 6 for partition in range(PARTITIONS)}  # 5 + a marker
    # the first batch of each transaction on each partition the other broker leads
    assert _verifications(cluster, other) >= before + 3 * len(elsewhere)
    got = read_all(cluster.bootstrap, topic_name, PARTITIONS, "read_committed", ends)
    values = sorted(value.decode() for _, _, value in got)
    assert values == sorted(f"t{txn}-p{partition}-{i}" for txn in (0, 2)
                            for partition in range(PARTITIONS) for i in range(5))
