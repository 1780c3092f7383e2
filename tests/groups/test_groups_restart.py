"""Acceptance 2 (groups): committed offsets survive a broker restart (SIGTERM and kill -9)
and a restart with a different offsetsTopicNumPartitions; OffsetFetch answers what was
committed and a new member of the group gets exactly the uncommitted remainder."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import confluent_kafka
import kafka
import kafka.errors
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient
from kafka.admin import KafkaAdminClient

from tests.broker_process import BrokerProcess
from tests.clients import create_topic, present
from tests.group_helpers import (
    COORDINATOR_LOAD_IN_PROGRESS,
    FAST_GROUPS,
    ILLEGAL_GENERATION,
    NONE,
    GroupConnection,
    assignment,
    group_id_for,
    join_in_thread,
    produce_values,
    start_broker,
    wait_until,
)

PARTITIONS = 3
PER_PARTITION = 1000
COMMITTED = {0: 400, 1: 1000, 2: 123}


def consume_and_commit(bootstrap: str, group: str, topic: str,
                       targets: dict[int, int]) -> None:
    """A group member reads each partition up to its target and commits exactly the targets
    (with metadata), synchronously; then leaves the group."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 250})
    start = consumer.committed([confluent_kafka.TopicPartition(topic, p) for p in targets],
                               timeout=20)
    reached = {tp.partition: max(tp.offset, 0) for tp in start}
    consumer.subscribe([topic])
    try:
        def step() -> None:
            for msg in consumer.consume(500, 0.1):
                assert msg.error() is None, msg.error()
                partition = present(msg.partition())
                reached[partition] = max(reached.get(partition, 0), present(msg.offset()) + 1)

        wait_until(lambda: all(reached.get(p, 0) >= t for p, t in targets.items()), 30,
                   "the member to read up to the targets", step)
        result = consumer.commit(offsets=[
            confluent_kafka.TopicPartition(topic, p, t, metadata=f"meta-{p}")
            for p, t in targets.items()], asynchronous=False)
        assert result is not None
        assert all(tp.error is None for tp in result), result
    finally:
        consumer.close()


def check_committed(bootstrap: str, group: str, topic: str, expected: dict[int, int]) -> None:
    """OffsetFetch through confluent's consumer.committed(), confluent's AdminClient and
    kafka-python's KafkaAdminClient all answer ``expected`` (with the metadata)."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                         "enable.auto.commit": False})
    try:
        got = consumer.committed([confluent_kafka.TopicPartition(topic, p) for p in expected],
                                 timeout=20)
    finally:
        consumer.close()
    assert {tp.partition: (tp.offset, tp.metadata) for tp in got} == {
        p: (o, f"meta-{p}") for p, o in expected.items()}

    admin = AdminClient({"bootstrap.servers": bootstrap})
    listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group] \
        .result(20)
    assert {tp.partition: tp.offset for tp in listed.topic_partitions
            if tp.topic == topic} == expected

    kadmin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = kadmin.list_group_offsets(group)[group]
    finally:
        kadmin.close()
    # confluent-kafka sends commit metadata with its C string terminator ("meta-0\x00");
    # the broker keeps the bytes as sent (test_groups_bad_input checks exact metadata), and
    # kafka-python shows them raw, so the terminator is dropped here.
    assert {tp.partition: (om.offset, om.metadata.removesuffix("\x00"))
            for tp, om in offsets.items() if tp.topic == topic} == {
        p: (o, f"meta-{p}") for p, o in expected.items()}


def resume_gets_exactly(bootstrap: str, group: str, topic: str,
                        expected: set[tuple[int, int]]) -> None:
    """A new member of ``group`` reads exactly ``expected`` (and nothing more within 1.5 s)."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 250})
    consumer.subscribe([topic])
    got: list[tuple[int, int]] = []

    def step() -> None:
        for msg in consumer.consume(500, 0.1):
            assert msg.error() is None, msg.error()
            got.append((present(msg.partition()), present(msg.offset())))

    try:
        wait_until(lambda: len(got) >= len(expected), 30, "the remainder", step)
        quiet_until = time.monotonic() + 1.5
        while time.monotonic() < quiet_until:
            step()
    finally:
        consumer.close()
    assert len(got) == len(set(got)), "records read twice"
    assert set(got) == expected, (sorted(set(got) - expected)[:5],
                                  sorted(expected - set(got))[:5])


def remainder(committed: dict[int, int]) -> set[tuple[int, int]]:
    return {(p, o) for p, c in committed.items() for o in range(c, PER_PARTITION)}


def restart(broker: BrokerProcess, how: str) -> None:
    if how == "sigterm":
        assert broker.stop() == 0
    else:
        broker.kill()
    broker.start()


def committed_group(broker: BrokerProcess, topic_name: str) -> str:
    """A topic of ``PER_PARTITION`` records a partition, and a group that consumed it and
    committed ``COMMITTED``: the group's id."""
    create_topic(broker.bootstrap, topic_name, PARTITIONS)
    produce_values(broker.bootstrap, topic_name, range(PARTITIONS), 0, PER_PARTITION)
    group = group_id_for(topic_name)
    consume_and_commit(broker.bootstrap, group, topic_name, COMMITTED)
    return group


@pytest.mark.parametrize("how", ["sigterm", "kill-9"])
def test_group_resumes_from_committed_offsets_after_restart(tmp_path: Path, topic_name: str,
                                                            how: str) -> None:
    broker = start_broker(tmp_path)
    try:
        group = committed_group(broker, topic_name)
        check_committed(broker.bootstrap, group, topic_name, COMMITTED)
        offsets_dirs = [d for d in tmp_path.rglob("__consumer_offsets")
                        if d.is_dir() and d.parent.name == "__kafka"]
        assert offsets_dirs, "no __consumer_offsets topic under <tenant>/__kafka/"

        restart(broker, how)  # right after the synchronous commit returned
        check_committed(broker.bootstrap, group, topic_name, COMMITTED)
        resume_gets_exactly(broker.bootstrap, group, topic_name, remainder(COMMITTED))
    finally:
        broker.kill()


def test_commits_after_a_restart_replace_the_replayed_ones(tmp_path: Path,
                                                           topic_name: str) -> None:
    broker = start_broker(tmp_path)
    try:
        group = committed_group(broker, topic_name)
        restart(broker, "kill-9")
        newer = {0: 900, 1: 1000, 2: 500}
        consume_and_commit(broker.bootstrap, group, topic_name, newer)
        restart(broker, "sigterm")
        check_committed(broker.bootstrap, group, topic_name, newer)
        resume_gets_exactly(broker.bootstrap, group, topic_name, remainder(newer))
    finally:
        broker.kill()


@pytest.mark.parametrize(("before", "after"), [("50", "7"), ("3", "50")])
def test_offsets_survive_a_different_offsets_topic_partition_count(
        tmp_path: Path, topic_name: str, before: str, after: str) -> None:
    broker = start_broker(tmp_path, offsetsTopicNumPartitions=before)
    try:
        member_group = committed_group(broker, topic_name)
        # More groups, committed as an admin does, so that they spread over the partitions.
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        others = {group_id_for(topic_name, f"g{i}"): {p: 10 * i + p for p in range(PARTITIONS)}
                  for i in range(12)}
        for group, offsets in others.items():
            request = ConsumerGroupTopicPartitions(group, [
                confluent_kafka.TopicPartition(topic_name, p, o, metadata=f"meta-{p}")
                for p, o in offsets.items()])
            result = admin.alter_consumer_group_offsets([request])[group].result(20)
            assert all(tp.error is None for tp in result.topic_partitions)

        assert broker.stop() == 0
        broker.settings["offsetsTopicNumPartitions"] = after
        broker.start()

        check_committed(broker.bootstrap, member_group, topic_name, COMMITTED)
        kadmin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        try:
            fetched = kadmin.list_group_offsets(list(others))
        finally:
            kadmin.close()
        assert {g: {tp.partition: om.offset for tp, om in offsets.items()}
                for g, offsets in fetched.items()} == others
        resume_gets_exactly(broker.bootstrap, member_group, topic_name, remainder(COMMITTED))
        # The group keeps working: a new commit lands and is read back after another restart.
        newer = {0: 700, 1: 1000, 2: 999}
        consume_and_commit(broker.bootstrap, member_group, topic_name, newer)
        restart(broker, "kill-9")
        check_committed(broker.bootstrap, member_group, topic_name, newer)
    finally:
        broker.kill()


def test_kafka_python_sees_the_same_offsets_after_restart(tmp_path: Path,
                                                          topic_name: str) -> None:
    broker = start_broker(tmp_path)
    try:
        group = committed_group(broker, topic_name)
        restart(broker, "sigterm")
        consumer = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group,
                                       enable_auto_commit=False)
        try:
            for p, offset in COMMITTED.items():
                assert consumer.committed(kafka.TopicPartition(topic_name, p)) == offset
        finally:
            consumer.close(autocommit=False)
    finally:
        broker.kill()


def dir_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


@pytest.mark.parametrize("how", ["sigterm", "kill-9"])
def test_compacted_offsets_topic_keeps_only_live_state(tmp_path: Path, topic_name: str,
                                                       how: str) -> None:
    broker = start_broker(tmp_path, offsetsTopicNumPartitions="1",
                          offsetsTopicSegmentBytes="4096",
                          offsetsTopicCompactionBytes="16384")
    try:
        create_topic(broker.bootstrap, topic_name, PARTITIONS)
        groups = [group_id_for(topic_name, f"g{i}") for i in range(4)]
        conn = GroupConnection(broker.port)
        try:
            for round_ in range(300):  # far more than 16 KiB of commits
                for g in groups:
                    answer = conn.commit(g, -1, "", topic_name, {
                        p: (round_ * 10 + p, f"{g}-{round_}-{p}".ljust(40, ".")) for p in
                        range(PARTITIONS)})
                    assert set(answer.values()) == {NONE}, answer
        finally:
            conn.close()
        final = {g: {p: 2990 + p for p in range(PARTITIONS)} for g in groups}
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.delete_consumer_groups([groups[3]])[groups[3]].result(10)
        del final[groups[3]]
        kadmin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        try:
            deleted = kadmin.delete_group_offsets(groups[2], [
                kafka.TopicPartition(topic_name, 1)])
            assert list(deleted.values()) == [kafka.errors.NoError]
        finally:
            kadmin.close()
        del final[groups[2]][1]

        offsets_dir = next(d for d in tmp_path.rglob("__consumer_offsets") if d.is_dir())
        on_disk = dir_bytes(offsets_dir)
        assert on_disk < 4 * 16384, f"{on_disk} bytes kept for __consumer_offsets"

        restart(broker, how)
        kadmin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        try:
            fetched = kadmin.list_group_offsets(groups[:3])
        finally:
            kadmin.close()
        assert {g: {tp.partition: om.offset for tp, om in offsets.items()}
                for g, offsets in fetched.items()} == final
        assert fetched[groups[0]][kafka.TopicPartition(topic_name, 2)].metadata == \
            f"{groups[0]}-299-2".ljust(40, ".")
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        gone = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(groups[3], [
            confluent_kafka.TopicPartition(topic_name, p) for p in range(PARTITIONS)])]
        )[groups[3]].result(10)
        assert [tp.offset for tp in gone.topic_partitions] == \
            [confluent_kafka.OFFSET_INVALID] * PARTITIONS
    finally:
        broker.kill()


def test_a_compaction_mid_rebalance_keeps_the_last_finished_generation(
        tmp_path: Path, topic_name: str) -> None:
    # As Kafka, which writes a group record only when a generation's assignment is stored
    # (or the group empties): a compaction while a rebalance is under way keeps the last
    # finished generation, and a restart comes back to it, not to the unfinished one.
    broker = start_broker(tmp_path, offsetsTopicNumPartitions="1",
                          offsetsTopicCompactionBytes="1024", **FAST_GROUPS)
    conn = GroupConnection(broker.port, timeout=30)
    try:
        create_topic(broker.bootstrap, topic_name, 2)
        group = group_id_for(topic_name)
        alone = conn.join(group, version=3, topics=(topic_name,))
        leader = alone.member_id
        assert alone.error_code == NONE and alone.leader == leader, alone
        assert conn.sync(group, alone.generation_id, leader,
                         {leader: assignment(topic_name, [0, 1])}).error_code == NONE
        thread, out = join_in_thread(broker.port, group, version=3, topics=(topic_name,))
        wait_until(lambda: conn.heartbeat(group, alone.generation_id, leader) != NONE, 30,
                   "the second member's join")
        rejoined = conn.join(group, leader, version=3, topics=(topic_name,))
        thread.join(30)
        assert len(out) == 1 and not isinstance(out[0], Exception), out
        follower, gen = out[0].member_id, rejoined.generation_id
        assert rejoined.error_code == out[0].error_code == NONE, (rejoined, out[0])
        assert rejoined.leader == leader and out[0].generation_id == gen
        other = GroupConnection(broker.port, timeout=30)
        try:
            sync_thread = threading.Thread(
                target=lambda: out.append(other.sync(group, gen, follower)), daemon=True)
            sync_thread.start()
            plan = {leader: assignment(topic_name, [0]), follower: assignment(topic_name, [1])}
            assert conn.sync(group, gen, leader, plan).error_code == NONE
            sync_thread.join(30)
            assert len(out) == 2 and out[1].error_code == NONE, out
            # the follower leaves: the leader rejoins alone, generation gen + 1, not synced
            assert other.leave(group, [(follower, None)]).error_code == NONE
        finally:
            other.close()
        again = conn.join(group, leader, version=3, topics=(topic_name,))
        assert again.error_code == NONE and again.generation_id == gen + 1, again
        # another group's commit fills the (single) offsets partition past its compaction
        # threshold: the log is compacted while the group is mid-rebalance
        assert conn.commit("filler-" + group, -1, "", topic_name,
                           {0: (1, "x" * 3000)}) == {0: NONE}
        conn.close()
        restart(broker, "kill-9")
        conn = GroupConnection(broker.port, timeout=30)

        synced: list[Any] = []

        def loaded() -> bool:  # (a heartbeat is answered NONE while it loads, as Kafka)
            synced.append(conn.sync(group, gen + 1, leader,
                                    {leader: assignment(topic_name, [0, 1])}))
            return bool(synced[-1].error_code != COORDINATOR_LOAD_IN_PROGRESS)

        wait_until(loaded, 60, "the offsets partition to load")
        # generation gen + 1 never finished: it is not what came back
        assert synced[-1].error_code == ILLEGAL_GENERATION, synced[-1]
        assert conn.heartbeat(group, gen, leader) == NONE
    finally:
        conn.close()
        broker.kill()
