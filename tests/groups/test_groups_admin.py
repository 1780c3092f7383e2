"""Acceptance 4 (groups): group administration through confluent-kafka's AdminClient and
kafka-python's KafkaAdminClient: listing and describing groups (members, assignments,
state, protocol), deleting groups and group offsets with Kafka's errors, and consumer lag
computed by a client from committed and latest offsets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import kafka
import pytest
from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, KafkaException
from confluent_kafka.admin import AdminClient, OffsetSpec
from kafka.admin import KafkaAdminClient
from kafka.errors import GroupIdNotFoundError, GroupSubscribedToTopicError, NoError

from tests.broker_process import BrokerProcess
from tests.clients import create_topic, present
from tests.group_helpers import (
    ConfluentMember,
    GroupLedger,
    balanced,
    group_id_for,
    produce_values,
    pump,
    start_broker,
)
from tests.security_helpers import OpsConnection

PARTITIONS = 4


@pytest.fixture(scope="module")
def abroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = start_broker(Path(tmp_path_factory.mktemp("groups-admin")))
    yield process
    process.stop()


@pytest.fixture
def kadmin(abroker: BrokerProcess) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=abroker.bootstrap)
    yield client
    client.close()


def admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def error_name(exc: BaseException) -> str:
    assert isinstance(exc, KafkaException), exc
    return str(exc.args[0].name())


def active_group(broker: BrokerProcess, topic: str, group: str, names: list[str],
                 records: int = 100) -> tuple[list[ConfluentMember], GroupLedger]:
    """Members ``names`` of ``group``, balanced over the topic, with everything committed."""
    ledger = GroupLedger()
    members = [ConfluentMember(n, broker.bootstrap, group, topic, ledger) for n in names]
    pump(members, lambda: balanced(ledger, names, PARTITIONS)()
         and ledger.all_committed(PARTITIONS, records)(), 60, "a balanced, committed group")
    return members, ledger


def listed(client: AdminClient, **kwargs: object) -> dict[str, object]:
    result = client.list_consumer_groups(**kwargs).result(10)
    assert result.errors == []
    return {g.group_id: g for g in result.valid}


def test_list_and_describe_groups(abroker: BrokerProcess, kadmin: KafkaAdminClient,
                                  topic_name: str) -> None:
    create_topic(abroker.bootstrap, topic_name, PARTITIONS)
    produce_values(abroker.bootstrap, topic_name, range(PARTITIONS), 0, 100)
    group = group_id_for(topic_name)
    client = admin(abroker)
    members, ledger = active_group(abroker, topic_name, group, ["m0", "m1"])
    try:
        groups = listed(client)
        assert group in groups
        assert groups[group].state == ConsumerGroupState.STABLE  # type: ignore[attr-defined]
        assert not groups[group].is_simple_consumer_group  # type: ignore[attr-defined]
        assert group in listed(client, states={ConsumerGroupState.STABLE})
        assert group not in listed(client, states={ConsumerGroupState.EMPTY})

        described = client.describe_consumer_groups([group])[group].result(10)
        assert described.group_id == group
        assert described.state == ConsumerGroupState.STABLE
        assert described.partition_assignor == "range"
        assert not described.is_simple_consumer_group
        assert described.coordinator.id == 0
        assert described.coordinator.port == abroker.port
        assert sorted(m.client_id for m in described.members) == ["m0", "m1"]
        owned = ledger.ownership()
        for m in described.members:
            assert m.host.lstrip("/") == "127.0.0.1", m.host
            assert m.member_id.startswith(m.client_id)
            assert {(tp.topic, tp.partition) for tp in m.assignment.topic_partitions} == \
                {(topic_name, p) for p in owned[m.client_id]}

        # kafka-python agrees.
        kgroups = {g["group_id"]: g for g in kadmin.list_groups()}
        assert kgroups[group]["protocol_type"] == "consumer"
        assert kgroups[group]["group_state"] == "Stable"
        assert group in {g["group_id"] for g in kadmin.list_groups(states_filter=["Stable"])}
        assert group not in {g["group_id"] for g in kadmin.list_groups(states_filter=["Empty"])}
        kdesc = kadmin.describe_groups([group])[group]
        assert kdesc["error"] is None
        assert kdesc["group_state"] == "Stable"
        assert kdesc["protocol_type"] == "consumer"
        assert kdesc["protocol_data"] == "range"
        assert sorted(m["member_id"] for m in kdesc["members"]) == \
            sorted(m.member_id for m in described.members)
        assert sorted(m["client_id"] for m in kdesc["members"]) == ["m0", "m1"]
    finally:
        for member in members:
            member.close()

    described = client.describe_consumer_groups([group])[group].result(10)
    assert described.state == ConsumerGroupState.EMPTY
    assert described.members == []
    assert listed(client)[group].state == ConsumerGroupState.EMPTY  # type: ignore[attr-defined]
    kdesc = kadmin.describe_groups([group])[group]
    assert (kdesc["group_state"], kdesc["members"]) == ("Empty", [])


def test_delete_groups(abroker: BrokerProcess, kadmin: KafkaAdminClient,
                       topic_name: str) -> None:
    create_topic(abroker.bootstrap, topic_name, PARTITIONS)
    produce_values(abroker.bootstrap, topic_name, range(PARTITIONS), 0, 100)
    group = group_id_for(topic_name)
    client = admin(abroker)
    members, _ledger = active_group(abroker, topic_name, group, ["m0"])
    try:
        with pytest.raises(KafkaException) as busy:
            client.delete_consumer_groups([group])[group].result(10)
        assert error_name(busy.value) == "NON_EMPTY_GROUP"
        assert kadmin.delete_groups([group]) == {group: "NonEmptyGroupError"}
        assert group in listed(client)
    finally:
        for member in members:
            member.close()

    assert client.delete_consumer_groups([group])[group].result(10) is None
    assert group not in listed(client)
    dead = client.describe_consumer_groups([group])[group].result(10)
    assert (dead.state, dead.members) == (ConsumerGroupState.DEAD, [])
    offsets = client.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, [
        confluent_kafka.TopicPartition(topic_name, p) for p in range(PARTITIONS)])])[group] \
        .result(10)
    assert [tp.offset for tp in offsets.topic_partitions] == \
        [confluent_kafka.OFFSET_INVALID] * PARTITIONS
    with pytest.raises(KafkaException) as gone:
        client.delete_consumer_groups([group])[group].result(10)
    assert error_name(gone.value) == "GROUP_ID_NOT_FOUND"
    assert kadmin.delete_groups([group]) == {group: "GroupIdNotFoundError"}
    never = group + "-never"
    with pytest.raises(KafkaException) as unknown:
        client.delete_consumer_groups([never])[never].result(10)
    assert error_name(unknown.value) == "GROUP_ID_NOT_FOUND"

    # The deleted group can be used again from scratch.
    again, ledger = active_group(abroker, topic_name, group, ["m0"])
    for member in again:
        member.close()
    assert ledger.count_by("m0") == PARTITIONS * 100


def test_delete_group_offsets(abroker: BrokerProcess, kadmin: KafkaAdminClient,
                              topic_name: str) -> None:
    create_topic(abroker.bootstrap, topic_name, PARTITIONS)
    other_topic = topic_name + "-other"
    create_topic(abroker.bootstrap, other_topic, 1)
    produce_values(abroker.bootstrap, topic_name, range(PARTITIONS), 0, 100)
    group = group_id_for(topic_name)
    tp = kafka.TopicPartition
    client = admin(abroker)
    result = client.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, [
        confluent_kafka.TopicPartition(other_topic, 0, 5)])])[group].result(10)
    assert all(p.error is None for p in result.topic_partitions)
    members, _ledger = active_group(abroker, topic_name, group, ["m0"])
    try:
        busy = kadmin.delete_group_offsets(group, [tp(topic_name, 0), tp(topic_name, 1)])
        assert busy == {tp(topic_name, 0): GroupSubscribedToTopicError,
                        tp(topic_name, 1): GroupSubscribedToTopicError}
        assert kadmin.delete_group_offsets(group, [tp(other_topic, 0)]) == \
            {tp(other_topic, 0): NoError}
        committed = kadmin.list_group_offsets(group)[group]
        assert {(k.topic, k.partition): v.offset for k, v in committed.items()} == \
            {(topic_name, p): 100 for p in range(PARTITIONS)}
    finally:
        for member in members:
            member.close()

    assert kadmin.delete_group_offsets(group, [tp(topic_name, 0), tp(topic_name, 2)]) == \
        {tp(topic_name, 0): NoError, tp(topic_name, 2): NoError}
    committed = kadmin.list_group_offsets(group)[group]
    assert {(k.topic, k.partition): v.offset for k, v in committed.items()} == \
        {(topic_name, 1): 100, (topic_name, 3): 100}
    consumer = confluent_kafka.Consumer({"bootstrap.servers": abroker.bootstrap,
                                         "group.id": group})
    try:
        got = consumer.committed([confluent_kafka.TopicPartition(topic_name, p)
                                  for p in range(PARTITIONS)], timeout=10)
    finally:
        consumer.close()
    assert [t.offset for t in got] == [confluent_kafka.OFFSET_INVALID, 100,
                                       confluent_kafka.OFFSET_INVALID, 100]
    # the same partition twice in one request: deleted once, both answered (a KeyError
    # closed the connection; found by tests/fuzz_requests.py)
    raw = OpsConnection(abroker.port)
    try:
        answer = raw.offset_delete(group, topic_name, [1, 1])
        assert answer.error_code == 0
        assert [p.error_code for p in answer.topics[0].partitions] == [0, 0]
        assert list(kadmin.list_group_offsets(group)[group]) == [tp(topic_name, 3)]
    finally:
        raw.close()
    with pytest.raises(GroupIdNotFoundError):
        kadmin.delete_group_offsets(group + "-never", [tp(topic_name, 0)])


def test_consumer_lag_from_committed_and_latest_offsets(abroker: BrokerProcess,
                                                        kadmin: KafkaAdminClient,
                                                        topic_name: str) -> None:
    create_topic(abroker.bootstrap, topic_name, 3)
    produced = {0: 300, 1: 200, 2: 100}
    for p, count in produced.items():
        produce_values(abroker.bootstrap, topic_name, [p], 0, count)
    group = group_id_for(topic_name)
    commits = {0: 250, 1: 200, 2: 40}
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": abroker.bootstrap, "group.id": group,
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000, "heartbeat.interval.ms": 250})
    consumer.subscribe([topic_name])
    reached: dict[int, int] = {}
    try:
        while any(reached.get(p, 0) < c for p, c in commits.items()):
            for msg in consumer.consume(500, 0.2):
                assert msg.error() is None
                reached[present(msg.partition())] = present(msg.offset()) + 1
        consumer.commit(offsets=[confluent_kafka.TopicPartition(topic_name, p, c)
                                 for p, c in commits.items()], asynchronous=False)

        client = admin(abroker)
        tps = [confluent_kafka.TopicPartition(topic_name, p) for p in produced]
        committed = client.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group, tps)])[group].result(10)
        committed_by_p = {t.partition: t.offset for t in committed.topic_partitions}
        latest = client.list_offsets({t: OffsetSpec.latest() for t in tps})
        latest_by_p = {t.partition: f.result(10).offset for t, f in latest.items()}
        watermarks = {p: consumer.get_watermark_offsets(
            confluent_kafka.TopicPartition(topic_name, p), timeout=10) for p in produced}
        assert latest_by_p == produced
        assert watermarks == {p: (0, n) for p, n in produced.items()}
        lag = {p: latest_by_p[p] - committed_by_p[p] for p in produced}
        assert lag == {p: produced[p] - commits[p] for p in produced}
        assert sum(lag.values()) == sum(produced.values()) - sum(commits.values()) == 110

        # kafka-python computes the same lag.
        koffsets = kadmin.list_group_offsets(group)[group]
        kconsumer = kafka.KafkaConsumer(bootstrap_servers=abroker.bootstrap)
        try:
            ends = kconsumer.end_offsets([kafka.TopicPartition(topic_name, p)
                                          for p in produced])
        finally:
            kconsumer.close()
        assert {k.partition: ends[k] - v.offset for k, v in koffsets.items()} == lag
    finally:
        consumer.close()


def test_a_deleted_topics_offsets_go_with_it(abroker: BrokerProcess, topic_name: str) -> None:
    """As Kafka: deleting a topic removes the offsets groups committed on it, so a group
    reading the topic created again under the name starts where auto.offset.reset says,
    not at an offset of the old topic (it skipped the new topic's first records)."""
    group = f"g-{topic_name}"
    create_topic(abroker.bootstrap, topic_name, 1)
    committer = confluent_kafka.Consumer({"bootstrap.servers": abroker.bootstrap,
                                          "group.id": group, "enable.auto.commit": False})
    committer.commit(offsets=[confluent_kafka.TopicPartition(topic_name, 0, 3)],
                     asynchronous=False)
    committer.close()
    client = admin(abroker)  # held: its futures fail if it goes first
    client.delete_topics([topic_name])[topic_name].result(10)
    abroker.wait_for_log(rf"removed 1 offsets of group {group} on a deleted topic")
    create_topic(abroker.bootstrap, topic_name, 1)
    producer = confluent_kafka.Producer({"bootstrap.servers": abroker.bootstrap})
    for i in range(5):
        producer.produce(topic_name, f"new-{i}".encode(), partition=0)
    assert producer.flush(10) == 0
    reader = confluent_kafka.Consumer({"bootstrap.servers": abroker.bootstrap,
                                       "group.id": group, "auto.offset.reset": "earliest",
                                       "enable.auto.commit": False})
    try:
        assert reader.committed([confluent_kafka.TopicPartition(topic_name, 0)],
                                timeout=10)[0].offset < 0
        reader.assign([confluent_kafka.TopicPartition(topic_name, 0)])
        got: list[int] = []
        while len(got) < 5:
            messages = reader.consume(5, 10)
            assert messages, got
            got += [present(m.offset()) for m in messages if m.error() is None]
        assert got == [0, 1, 2, 3, 4]
    finally:
        reader.close()
