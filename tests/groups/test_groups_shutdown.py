"""SIGTERM in the middle of a rebalance: the broker stops within seconds, whatever its groups
are doing.

A JoinGroup waiting for its rebalance (here the first rebalance of an empty group, held for
``groupInitialRebalanceDelayMs`` = 60 s) is answered NOT_COORDINATOR at shutdown, as Kafka
answers when a coordinator unloads its groups, instead of holding the shutdown until the
listeners' grace period runs out (10 s per listener, so 20 s on the two listeners used
here: the exit bound of 15 s is a liveness check with room for a slow disk, not a
benchmark); the offsets committed before are intact after a restart. The same holds for a
SyncGroup waiting for its leader's assignment and for a JoinGroup waiting for a stable
member to rejoin within its rebalance timeout.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import confluent_kafka

from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.group_helpers import (
    COORDINATOR_LOAD_IN_PROGRESS,
    NONE,
    NOT_COORDINATOR,
    GroupConnection,
    produce_values,
    wait_until,
)

LONG_DELAY_MS = "60000"
COMMITTED = {0: 3, 1: 5}
EXIT_BOUND_S = 15
TWO_LISTENERS = {"kafkaListeners": "PLAINTEXT://127.0.0.1:0,OTHER://127.0.0.1:0",
                 "kafkaProtocolMap": "PLAINTEXT:PLAINTEXT,OTHER:PLAINTEXT",
                 "offsetsTopicNumPartitions": "2"}


def commit_offsets(bootstrap: str, group: str, topic: str) -> None:
    """A real consumer commits COMMITTED for ``group`` (assigned partitions, no membership)."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                         "enable.auto.commit": False})
    try:
        result = consumer.commit(offsets=[confluent_kafka.TopicPartition(topic, p, o)
                                          for p, o in COMMITTED.items()], asynchronous=False)
        assert result is not None and all(tp.error is None for tp in result), result
    finally:
        consumer.close()


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets, once the restarted broker has replayed them."""
    conn = GroupConnection(int(bootstrap.rsplit(":", 1)[1]))
    found: dict[int, tuple[int, str | None, int]] = {}

    def loaded() -> bool:
        error, answer = conn.fetch_offsets(group, topic, sorted(COMMITTED))
        assert error in (NONE, COORDINATOR_LOAD_IN_PROGRESS), error
        found.update(answer)
        return error == NONE

    try:
        wait_until(loaded, 20, "the offsets to be replayed")
        return {p: offset for p, (offset, _meta, _error) in found.items()}
    finally:
        conn.close()


def group_state(port: int, group: str) -> tuple[str, int]:
    from kafka.protocol.admin import DescribeGroupsRequest, DescribeGroupsResponse
    conn = GroupConnection(port)
    try:
        answer = conn.call(DescribeGroupsRequest[5](groups=[group],
                                                    include_authorized_operations=False),
                           5, DescribeGroupsResponse)
        described = answer.groups[0]
        return str(described.group_state), len(described.members)
    finally:
        conn.close()


def test_sigterm_mid_rebalance_stops_quickly_and_keeps_offsets(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path, {**TWO_LISTENERS,
                                      "groupInitialRebalanceDelayMs": LONG_DELAY_MS}).start()
    consumer: confluent_kafka.Consumer | None = None
    polling = threading.Event()
    poller: threading.Thread | None = None
    try:
        plain = f"127.0.0.1:{broker.ports['PLAINTEXT']}"
        other = broker.ports["OTHER"]
        create_topic(plain, "orders", 2)
        produce_values(plain, "orders", [0, 1], 0, 10)
        commit_offsets(plain, "billing", "orders")

        # A real consumer joins "billing": its first rebalance waits 60 s for more members.
        consumer = confluent_kafka.Consumer({
            "bootstrap.servers": plain, "group.id": "billing", "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "session.timeout.ms": 10000,
            "max.poll.interval.ms": 120000})
        consumer.subscribe(["orders"])
        polling.set()

        def poll() -> None:
            while polling.is_set():
                assert consumer is not None
                consumer.poll(0.2)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        # And a raw member of another group, on the other listener, waits the same way.
        raw = GroupConnection(other, timeout=60)
        first = raw.join("audit", "", rebalance_ms=60_000)
        answers: list[Any] = []
        waiter = threading.Thread(target=lambda: answers.append(
            raw.join("audit", first.member_id, rebalance_ms=60_000)), daemon=True)
        waiter.start()
        wait_until(lambda: group_state(other, "billing") == ("PreparingRebalance", 1), 20,
                   "the consumer to be waiting in its first rebalance")
        wait_until(lambda: group_state(other, "audit") == ("PreparingRebalance", 1), 20,
                   "the raw member to be waiting in its first rebalance")

        assert broker.stop(timeout=EXIT_BOUND_S) == 0
        waiter.join(5)
        assert answers, "the waiting JoinGroup was not answered at shutdown"
        assert answers[0].error_code == NOT_COORDINATOR
        raw.close()
        assert "edge-broker stopped" in broker.log_text()

        broker.start()
        assert committed(f"127.0.0.1:{broker.ports['PLAINTEXT']}", "billing", "orders") == \
            COMMITTED
    finally:
        polling.clear()
        if poller is not None:
            poller.join(5)
        if consumer is not None:
            consumer.close()
        broker.kill()


def in_background(call: Any) -> tuple[threading.Thread, list[Any]]:
    """Run ``call`` in a thread; its answer lands in the returned list."""
    answers: list[Any] = []
    thread = threading.Thread(target=lambda: answers.append(call()), daemon=True)
    thread.start()
    return thread, answers


def test_sigterm_answers_a_waiting_sync_and_a_waiting_rejoin(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path, {**TWO_LISTENERS,
                                      "groupInitialRebalanceDelayMs": "300"}).start()
    try:
        create_topic(broker.bootstrap, "orders", 2)
        # One group's members on each listener: each listener has a request waiting.
        conns = [GroupConnection(broker.ports[name], timeout=60)
                 for name in ("PLAINTEXT", "PLAINTEXT", "OTHER", "OTHER")]
        a1, a2, b1, b2 = conns
        # Group "pair": two members join in the same initial delay; the follower's
        # SyncGroup then waits for the leader's, which never comes.
        ids = [c.join("pair", "").member_id for c in (a1, a2)]
        joins = [in_background(lambda c=c, m=m: c.join("pair", m, rebalance_ms=60_000))
                 for c, m in zip((a1, a2), ids, strict=True)]
        for thread, _answers in joins:
            thread.join(20)
        joined = [answers[0] for _thread, answers in joins]
        assert all(j.error_code == NONE for j in joined), joined
        follower = next(j for j in joined if j.member_id != j.leader)
        follower_conn = a1 if follower.member_id == ids[0] else a2
        sync_thread, sync_answers = in_background(lambda: follower_conn.sync(
            "pair", follower.generation_id, follower.member_id))
        # Group "solo": one stable member commits offsets; a second member's JoinGroup
        # then waits up to 60 s for the first to rejoin, which it never does.
        first = b1.join_new("solo", rebalance_ms=60_000)
        assert first.error_code == NONE
        assignment = {first.member_id: b""}
        assert b1.sync("solo", first.generation_id, first.member_id, assignment).error_code \
            == NONE
        assert b1.commit("solo", first.generation_id, first.member_id, "orders",
                         {p: (o, "kept") for p, o in COMMITTED.items()}) == \
            {p: NONE for p in COMMITTED}
        newcomer = b2.join("solo", "")
        join_thread, join_answers = in_background(
            lambda: b2.join("solo", newcomer.member_id, rebalance_ms=60_000))
        wait_until(lambda: group_state(broker.port, "solo") == ("PreparingRebalance", 2), 20,
                   "the newcomer to wait for the stable member")
        assert group_state(broker.port, "pair") == ("CompletingRebalance", 2)

        assert broker.stop(timeout=EXIT_BOUND_S) == 0
        sync_thread.join(5)
        join_thread.join(5)
        assert sync_answers and sync_answers[0].error_code == NOT_COORDINATOR
        assert join_answers and join_answers[0].error_code == NOT_COORDINATOR
        for conn in conns:
            conn.close()

        broker.start()
        assert committed(broker.bootstrap, "solo", "orders") == COMMITTED
    finally:
        broker.kill()
