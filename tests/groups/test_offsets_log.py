"""``__consumer_offsets`` stays bounded by snapshot compaction and keeps the latest state across
restarts; expired offsets of empty groups are removed (coordinator driven directly, with
real storage, for the time-based part)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from pathlib import Path

import confluent_kafka
import kafka
import psycopg
from kafka.admin import KafkaAdminClient

from broker_core.appends import AppendPath
from broker_core.codec.records import key_values
from broker_core.durability import FlushScheduler
from broker_core.groups.config import GroupConfig
from broker_core.groups.coordinator import GroupCoordinator
from broker_core.groups.offsets import OffsetToCommit
from broker_core.storage import LogConfig, open_storage
from broker_core.system_topics import SystemTopic
from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.groups.test_offsets_txn_order import OFFSETS_TOPIC
from tests.postgres_server import shared_server
from tests.txn_helpers import wait_until


def offsets_size(data_dir: Path) -> int:
    return sum(f.stat().st_size for f in data_dir.rglob("*.ledger")
               if "__consumer_offsets" in str(f))


COMPACTING = {"offsetsTopicNumPartitions": "2", "offsetsTopicSegmentBytes": "4096",
              "offsetsTopicCompactionBytes": "8192"}


def commit_compact_restart(broker: BrokerProcess, topic: str,
                           stored_size: Callable[[], int]) -> None:
    """400 commits of 3 offsets are compacted to a small size (``stored_size``) and the
    latest ones survive a restart of the broker."""
    create_topic(broker.bootstrap, topic, 3)
    consumer = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap,
                                   group_id="compacted", enable_auto_commit=False)
    tps = [kafka.TopicPartition(topic, p) for p in range(3)]
    for i in range(400):
        consumer.commit({tp: kafka.OffsetAndMetadata(i * 10 + tp.partition, "m" * 20, -1)
                         for tp in tps})
    consumer.close()
    broker.wait_for_log(r"compacted .*__consumer_offsets")
    assert stored_size() < 64 * 1024  # 400 commits of 3 offsets, kept small
    broker.stop()
    broker.start()
    reader = confluent_kafka.Consumer({"bootstrap.servers": broker.bootstrap,
                                       "group.id": "compacted"})
    committed = reader.committed([confluent_kafka.TopicPartition(topic, p)
                                  for p in range(3)], timeout=20)
    reader.close()
    assert [(c.partition, c.offset) for c in committed] == [(p, 3990 + p) for p in range(3)]
    # the metadata through kafka-python: confluent-kafka reads a TopicPartition's metadata
    # as a C string, which librdkafka's copy of it is not (no terminator: the bytes after
    # the 20 it holds came back as well, heap garbage; librdkafka#4649's family)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        offsets = admin.list_group_offsets("compacted")["compacted"]
    finally:
        admin.close()
    assert sorted((tp.partition, om.offset, om.metadata) for tp, om in offsets.items()
                  if tp.topic == topic) == [(p, 3990 + p, "m" * 20) for p in range(3)]


def test_offsets_topic_is_compacted_and_survives_restart(tmp_path: Path,
                                                         topic_name: str) -> None:
    broker = BrokerProcess(tmp_path, COMPACTING).start()
    try:
        commit_compact_restart(broker, topic_name, lambda: offsets_size(tmp_path))
    finally:
        broker.kill()


def test_offsets_of_long_empty_groups_expire(tmp_path: Path) -> None:
    async def scenario() -> None:
        logs = open_storage(tmp_path.as_uri(), LogConfig())
        logs.create_topic("public/default/t", 1, {})
        appends = AppendPath(FlushScheduler(2**63 - 1, 0))
        store = SystemTopic(logs, appends, "__consumer_offsets", 3, 1 << 20, 1 << 30)
        config = GroupConfig(offsets_retention_ms=60_000)
        groups = GroupCoordinator(config, store)
        topic = "public/__kafka/__consumer_offsets"
        assert groups.check(topic, "standalone") == 0
        error, results = await groups.commit(topic, "standalone", "", None, -1, [
            OffsetToCommit("public/default/t", 0, 42, -1, "")])
        assert error == 0 and set(results.values()) == {0}
        committed = groups.committed(topic, "standalone", None)[("public/default/t", 0)]
        assert committed is not None
        await groups.expire_offsets(committed.commit_timestamp + 30_000)
        assert groups.find(topic, "standalone") is not None  # not yet
        await groups.expire_offsets(committed.commit_timestamp + 61_000)
        assert groups.find(topic, "standalone") is None
        await groups.stop()
        logs.close()
        # the expiry was written: a new coordinator replays and finds nothing
        logs = open_storage(tmp_path.as_uri(), LogConfig())
        again = GroupCoordinator(config, SystemTopic(logs, appends, "__consumer_offsets", 3,
                                                     1 << 20, 1 << 30))
        again.start()
        for _ in range(100):
            if again.check(topic, "standalone") == 0:
                break
            await asyncio.sleep(0.01)
        assert again.committed(topic, "standalone", None) == {}
        await again.stop()
        logs.close()

    asyncio.run(scenario())


def test_offsets_topic_is_compacted_on_postgres_too(tmp_path: Path, topic_name: str) -> None:
    """The same snapshot compaction on the PostgreSQL engine: the rows it replaces are
    deleted, and the state survives a restart."""
    url = shared_server().new_database_url()

    def stored_size() -> int:
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT coalesce(sum(e.size), 0) FROM edge_entries e JOIN edge_partitions p"
                " ON p.id = e.partition_id WHERE p.topic LIKE '%%/__consumer_offsets'"
            ).fetchone()
        assert row is not None
        return int(row[0])

    broker = BrokerProcess(tmp_path, {"storageUrl": url, **COMPACTING}).start()
    try:
        commit_compact_restart(broker, topic_name, stored_size)
    finally:
        broker.kill()


def test_a_large_live_state_is_not_compacted_again_at_every_write(tmp_path: Path,
                                                                    topic_name: str) -> None:
    """A group whose live offsets outgrow the compaction threshold: a compaction writes
    them all, and the next compaction waits for as many bytes of new writes (the snapshot
    counted as written made every later commit rewrite the whole state on the loop)."""
    broker = BrokerProcess(tmp_path, {**COMPACTING, "offsetsTopicNumPartitions": "1"}).start()
    try:
        create_topic(broker.bootstrap, topic_name, 200)
        consumer = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap,
                                       group_id="large", enable_auto_commit=False)
        everything = {kafka.TopicPartition(topic_name, p): kafka.OffsetAndMetadata(
            1, "m" * 100, -1) for p in range(200)}  # about 40 KiB live: 5x the threshold
        consumer.commit(everything)
        consumer.commit(everything)
        broker.wait_for_log(r"compacted .*__consumer_offsets")
        mark = len(broker.lines)
        one = kafka.TopicPartition(topic_name, 0)
        for i in range(60):  # about 12 KiB of new writes: above the threshold, below live
            consumer.commit({one: kafka.OffsetAndMetadata(2 + i, "m" * 100, -1)})
        consumer.close()
        compactions = [line for line in broker.lines[mark:]
                       if "compacted" in line and "__consumer_offsets" in line]
        assert len(compactions) <= 1, compactions
    finally:
        broker.kill()


def _stored_txn_ends(data_dir: Path, group_id: str) -> int:
    """How many transaction end records of ``group_id`` the (stopped) broker's
    ``__consumer_offsets`` partition 0 holds, from its log start."""
    logs = open_storage(data_dir.resolve().as_uri(), LogConfig())
    try:
        stored = logs.partition(OFFSETS_TOPIC, 0)
        assert stored is not None
        start = stored.log_start_offset
        heads = [json.loads(key) for info in stored.batches_from(start)
                 for key, _ in key_values(info.batch, start)]
        return sum(head["type"] == "txnEnd" and head["group"] == group_id for head in heads)
    finally:
        logs.close()


def test_a_groups_fences_of_expired_transactional_ids_are_not_kept(tmp_path: Path,
                                                                   topic_name: str) -> None:
    """A sink that takes a new transactional id per checkpoint (as Flink's KafkaSink):
    once each id's last end is older than ``transactionalIdExpirationMs``, the group
    forgets its fence and the next compaction of ``__consumer_offsets`` leaves it out
    (the old code rewrote every fence into every compaction, for ever); the group's
    offsets come back after a restart."""
    broker = BrokerProcess(tmp_path, {
        **COMPACTING, "offsetsTopicNumPartitions": "1", "transactionalIdExpirationMs": "2000",
        "offsetsRetentionCheckIntervalMs": "200"}).start()
    checkpoints = 4
    try:
        create_topic(broker.bootstrap, topic_name, 1)
        consumer = confluent_kafka.Consumer({"bootstrap.servers": broker.bootstrap,
                                             "group.id": "sink"})
        for i in range(checkpoints):
            producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap,
                                                 "transactional.id": f"checkpoint-{i}"})
            producer.init_transactions(30)
            producer.begin_transaction()
            producer.produce(topic_name, value=f"v{i}".encode(), partition=0)
            producer.send_offsets_to_transaction(
                [confluent_kafka.TopicPartition(topic_name, 0, i + 1)],
                consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(30)
        consumer.close()

        def forgotten() -> int:
            return sum(int(found[1]) for found in
                       re.finditer(r"forgot (\d+) transaction fence", broker.log_text()))

        wait_until(lambda: forgotten() >= checkpoints, 30, "the fences to be forgotten")
        mark = len(broker.lines)
        committer = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="sink",
                                        enable_auto_commit=False)
        tp = kafka.TopicPartition(topic_name, 0)
        for _ in range(100):  # 20 KiB of commits: above offsetsTopicCompactionBytes
            committer.commit({tp: kafka.OffsetAndMetadata(checkpoints, "m" * 200, -1)})
        committer.close()
        broker.wait_for_log(r"compacted .*__consumer_offsets", after=mark)
        assert broker.stop() == 0
        assert _stored_txn_ends(tmp_path, "sink") == 0

        broker.start()
        reader = confluent_kafka.Consumer({"bootstrap.servers": broker.bootstrap,
                                           "group.id": "sink"})
        [committed] = reader.committed([confluent_kafka.TopicPartition(topic_name, 0)],
                                       timeout=20)
        reader.close()
        assert committed.offset == checkpoints
    finally:
        broker.kill()
