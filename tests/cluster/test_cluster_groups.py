"""Consumer groups on three brokers sharing one PostgreSQL: the broker coordinating a group is
killed with kill -9, then one leading partitions; the group finds its new coordinator,
rebalances there, its members continue from the committed offsets and every record is
processed (again only after a commit that failed). confluent-kafka, kafka-python and aiokafka
members, each group over a six-partition topic."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from tests.cluster.test_cluster import create
from tests.cluster_helpers import Cluster, running_cluster
from tests.group_helpers import (
    FAST_GROUPS,
    ConfluentMember,
    GroupLedger,
    balanced,
    group_id_for,
    produce_values,
    wait_until,
)
from tests.groups.test_groups_clients import AioKafkaMember, AioLoop, KafkaPythonMember, Member

PARTITIONS = 6
STEP = 100
"""Records per partition per phase."""


def coordinator_of(cluster: Cluster, group: str) -> int:
    """The id of the broker coordinating ``group`` (DescribeGroups' coordinator)."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    return int(admin.describe_consumer_groups([group])[group].result(20).coordinator.id)


def wait_moved(cluster: Cluster, topic: str, dead: int) -> dict[int, int]:
    """Until every live broker agrees that live brokers, not ``dead``, lead each partition
    of ``topic``; return that partition -> leader map."""
    settled: list[dict[int, int]] = []

    def moved() -> bool:
        agreed = cluster.agreed_leaders(topic)
        settled[:] = [agreed] if agreed is not None and dead not in agreed.values() else []
        return bool(settled)

    wait_until(moved, 30, f"broker {dead}'s partitions to move")
    return settled[0]


def records(start: int, stop: int) -> set[tuple[int, int]]:
    return {(p, o) for p in range(PARTITIONS) for o in range(start, stop)}


NewMember = Callable[[str, str, str, GroupLedger], Member]
"""(name, bootstrap, group, ledger) -> a member polling in a thread (or task) of its own."""


def run_failovers(cluster: Cluster, topic: str, new_member: NewMember) -> None:
    """Phase 1 consumed by three members; the coordinator killed and a member leaves: the
    other two rebalance on the new coordinator and consume phase 2; a broker leading
    partitions killed: phase 3 consumed from the last broker. Every record delivered as
    promised (GroupLedger.check_delivery)."""
    group = group_id_for(topic)
    ledger = GroupLedger()
    create(cluster.bootstrap, topic, PARTITIONS)
    live = {name: new_member(name, cluster.bootstrap, group, ledger) for name in "abc"}

    def until(condition: Callable[[], bool], what: str) -> None:
        def check() -> bool:
            for member in live.values():
                assert member.error is None, f"{member.name}: {member.error!r}"
            return condition()
        wait_until(check, 90, what)

    try:
        produce_values(cluster.bootstrap, topic, range(PARTITIONS), 0, STEP)
        until(balanced(ledger, ["a", "b", "c"], PARTITIONS), "three members to share it")
        until(ledger.all_committed(PARTITIONS, STEP), "phase 1 committed")

        first = coordinator_of(cluster, group)
        cluster.by_id(first).kill()
        wait_moved(cluster, topic, first)
        leaving = live.pop("c")
        leaving.stop()  # leaves through the new coordinator: the group rebalances there
        assert leaving.error is None, f"c: {leaving.error!r}"
        until(balanced(ledger, ["a", "b"], PARTITIONS), "a and b to share the topic")
        produce_values(cluster.bootstrap, topic, range(PARTITIONS), STEP, 2 * STEP)
        until(ledger.all_committed(PARTITIONS, 2 * STEP), "phase 2 committed")
        assert coordinator_of(cluster, group) != first

        second = next(iter(set(wait_moved(cluster, topic, first).values())))
        cluster.by_id(second).kill()
        wait_moved(cluster, topic, second)
        produce_values(cluster.bootstrap, topic, range(PARTITIONS), 2 * STEP, 3 * STEP)
        until(ledger.all_committed(PARTITIONS, 3 * STEP), "phase 3 committed")
    finally:
        for member in live.values():
            member.stop()
    for member in live.values():
        assert member.error is None, f"{member.name}: {member.error!r}"
    ledger.check_delivery(records(0, 3 * STEP))


class ThreadedConfluentMember:
    """A ConfluentMember stepping in a thread of its own, like the other clients' members."""

    def __init__(self, name: str, bootstrap: str, group: str, topic: str,
                 ledger: GroupLedger) -> None:
        self.name = name
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=name,
                                        args=(bootstrap, group, topic, ledger))
        self._thread.start()

    def _run(self, bootstrap: str, group: str, topic: str, ledger: GroupLedger) -> None:
        try:
            # the dead brokers are told to librdkafka's error callback, not to consume()
            member = ConfluentMember(self.name, bootstrap, group, topic, ledger,
                                     error_cb=lambda _error: None)
            try:
                while not self._stop.is_set():
                    member.step()
            finally:
                member.close()
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), f"{self.name} did not stop"


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python", "aiokafka"])
def test_a_group_survives_the_kill_of_its_coordinator_and_of_a_leader(
        tmp_path: Path, topic_name: str, client: str) -> None:
    aio = AioLoop()
    members: dict[str, NewMember] = {
        "confluent-kafka": lambda name, bootstrap, group, ledger: ThreadedConfluentMember(
            name, bootstrap, group, topic_name, ledger),
        "kafka-python": lambda name, bootstrap, group, ledger: KafkaPythonMember(
            name, bootstrap, group, topic_name, ledger),
        "aiokafka": lambda name, bootstrap, group, ledger: AioKafkaMember(
            aio, name, bootstrap, group, topic_name, ledger),
    }
    try:
        with running_cluster(tmp_path, settings=FAST_GROUPS) as cluster:
            run_failovers(cluster, topic_name, members[client])
    finally:
        aio.close()
