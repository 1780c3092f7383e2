"""KIP-496 in the group coordinator: a Stable consumer group's offsets of topics it no
longer subscribes to expire by their commit time, those of topics it subscribes to stay,
and the expiry is written (a restart replays them gone); OffsetDelete (API 47) through
kafka-python's KafkaAdminClient and ``edge-broker admin groups delete-offsets``, racing a
commit of the same partition, and on a group whose subscriptions are unknown.

The first tests drive the coordinator directly, on real storage, with the clock they are
given; the others use real clients against a broker. Its ``offsetsRetentionMinutes`` (1
at the least) would keep the expiry test waiting over a minute: that test recommits with
a retention of the request's own (OffsetCommit v2-v4's ``retention_time_ms``, which Kafka
honours as the offset's expire timestamp), a second."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient
from kafka import TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.errors import (
    GroupIdNotFoundError,
    GroupSubscribedToTopicError,
    NoError,
    UnknownTopicOrPartitionError,
)

from broker_core.appends import AppendPath
from broker_core.durability import FlushScheduler
from broker_core.errors import ErrorCode
from broker_core.groups.config import GroupConfig
from broker_core.groups.coordinator import GroupCoordinator
from broker_core.groups.effects import JoinRequest
from broker_core.groups.model import (
    CommittedOffset,
    Group,
    GroupState,
    JoinResult,
    SyncResult,
)
from broker_core.groups.offsets import GroupOffsets, OffsetToCommit
from broker_core.storage import LogConfig, Storage, open_storage
from broker_core.system_topics import SystemTopic
from tests.admin_cli_helpers import admin
from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.group_helpers import (
    ILLEGAL_GENERATION,
    NOT_COORDINATOR,
    GroupConnection,
    group_id_for,
    join_in_thread,
    produce_values,
    start_broker,
    subscription,
    wait_until,
)
from tests.postgres_server import shared_server

pytestmark = pytest.mark.long_running(minutes=3)

OFFSETS = "public/__kafka/__consumer_offsets"
RETENTION_MS = 60_000
OWN_RETENTION_MS = 1_000
"""The retention_time_ms of a commit with a retention of its own (OffsetCommit v2-v4)."""


def _storage(url: str, flush_every: int = 2**63 - 1) -> tuple[SystemTopic, Storage]:
    """The offsets topic on ``url``; the file engine fsyncs every ``flush_every`` records
    (an append is then settled only after its fsync, as on PostgreSQL after its commit)."""
    logs = open_storage(url, LogConfig())
    appends = AppendPath(FlushScheduler(flush_every, 0))
    return SystemTopic(logs, appends, "__consumer_offsets", 3, 1 << 20, 1 << 30), logs


async def _stable_member(groups: GroupCoordinator, group_id: str, protocol_type: str,
                         metadata: bytes) -> tuple[str, int]:
    """One member joins ``group_id`` and syncs; its member id and generation."""
    assert groups.check(OFFSETS, group_id) == 0
    joined = await groups.join(OFFSETS, group_id, JoinRequest(
        "", None, "client", "/127.0.0.1", 30_000, 30_000, protocol_type,
        [("range", metadata)], require_known_member=False))
    if isinstance(joined, asyncio.Future):
        joined = await joined
    assert isinstance(joined, JoinResult) and joined.error == 0, joined
    synced = await groups.sync(OFFSETS, group_id, joined.member_id, None, joined.generation,
                               protocol_type, "range", {joined.member_id: b""})
    if isinstance(synced, asyncio.Future):
        synced = await synced
    assert isinstance(synced, SyncResult) and synced.error == 0, synced
    group = groups.find(OFFSETS, group_id)
    assert group is not None and group.state == GroupState.STABLE
    return joined.member_id, joined.generation


@pytest.mark.parametrize("engine", ["file", "postgres"])
def test_stable_consumer_group_expires_offsets_of_unsubscribed_topics(tmp_path: Path,
                                                                      engine: str) -> None:
    """A Stable consumer group subscribed to ``a`` (its short name) and to
    ``public/other/c`` (a full name) has offsets on a, b and c committed past the
    retention: b's expire, a's and c's stay. A group of another protocol, and one whose
    subscription cannot be read, expire nothing while they have members. The tombstones
    are in the log: a new coordinator (after a restart, or another broker of a cluster on
    the same database) replays b gone."""
    topics = ("public/default/a", "public/default/b", "public/other/c")
    url = tmp_path.as_uri() if engine == "file" else shared_server().new_database_url()

    async def scenario() -> None:
        store, logs = _storage(url)
        for name in topics:
            logs.create_topic(name, 2, {})
        config = GroupConfig(offsets_retention_ms=RETENTION_MS, initial_rebalance_delay_ms=0)
        groups = GroupCoordinator(config, store)
        cases = {"consumers": ("consumer", subscription(["a", "public/other/c"])),
                 "connect": ("connect", subscription(["a"])),
                 "unreadable": ("consumer", b"\x00\x07garbage")}
        commit_ts = {}
        for group_id, (protocol_type, metadata) in cases.items():
            member, generation = await _stable_member(groups, group_id, protocol_type,
                                                      metadata)
            error, results = await groups.commit(OFFSETS, group_id, member, None, generation, [
                OffsetToCommit(t, p, 10 + p, -1, "") for t in topics for p in range(2)])
            assert error == 0 and set(results.values()) == {0}, results
            committed = groups.committed(OFFSETS, group_id, None)
            commit_ts[group_id] = max(c.commit_timestamp for c in committed.values() if c)
        latest = max(commit_ts.values())

        await groups.expire_offsets(latest + RETENTION_MS // 2)
        for group_id in cases:  # not yet past the retention
            assert len(groups.committed(OFFSETS, group_id, None)) == 6
        await groups.expire_offsets(latest + RETENTION_MS + 1_000)
        kept = set(groups.committed(OFFSETS, "consumers", None))
        assert kept == {(t, p) for t in (topics[0], topics[2]) for p in range(2)}
        group = groups.find(OFFSETS, "consumers")
        assert group is not None and group.state == GroupState.STABLE
        for group_id in ("connect", "unreadable"):
            assert len(groups.committed(OFFSETS, group_id, None)) == 6, group_id
        await groups.stop()
        logs.close()

        store, logs = _storage(url)
        again = GroupCoordinator(config, store)
        again.start()
        for _ in range(200):
            if again.check(OFFSETS, "consumers") == 0:
                break
            await asyncio.sleep(0.01)
        assert set(again.committed(OFFSETS, "consumers", None)) == kept
        assert len(again.committed(OFFSETS, "connect", None)) == 6
        await again.stop()
        logs.close()

    asyncio.run(scenario())


def test_an_offset_whose_commit_is_under_way_does_not_expire(tmp_path: Path) -> None:
    """As Kafka skips ``pendingOffsetCommits``: a tombstone appended after a commit's record
    would delete on replay the offset that commit is about to acknowledge."""
    store, logs = _storage(tmp_path.as_uri())
    offsets = GroupOffsets(store, 4096, RETENTION_MS, lambda _t, _p: iter(()))
    group = Group("standalone", OFFSETS, 0)
    old = CommittedOffset(5, -1, "", 1_000)
    group.offsets = {("public/default/a", 0): old, ("public/default/a", 1): old}
    group.committing[("public/default/a", 1)] = 1
    assert offsets.expired(group, 1_000 + RETENTION_MS + 1) == [("public/default/a", 0)]
    del group.committing[("public/default/a", 1)]
    assert len(offsets.expired(group, 1_000 + RETENTION_MS + 1)) == 2
    logs.close()


async def _coordinator(url: str) -> tuple[GroupCoordinator, Storage]:
    """A coordinator of the offsets stored at ``url`` (fsynced at every write), once it
    replayed them."""
    store, logs = _storage(url, flush_every=1)
    config = GroupConfig(offsets_retention_ms=RETENTION_MS, initial_rebalance_delay_ms=0)
    groups = GroupCoordinator(config, store)
    groups.start()
    for _ in range(500):
        if groups.check(OFFSETS, "standalone") == 0:
            break
        await asyncio.sleep(0.01)
    assert groups.check(OFFSETS, "standalone") == 0
    return groups, logs


@pytest.mark.parametrize("engine", ["file", "postgres"])
def test_an_offset_committed_with_its_own_retention_expires_by_it(tmp_path: Path,
                                                                  engine: str) -> None:
    """OffsetCommit v2-v4's ``retention_time_ms`` (other than -1), as Kafka keeps it: the
    offset expires that long after its commit instead of by the broker's retention, also
    after a restart (its record holds the expire timestamp). A group that only stores
    offsets loses the one committed with it and keeps the one committed without; a Stable
    consumer group subscribed to ``a`` loses b's and keeps a's, both committed with it
    (KIP-496 still decides whose offsets may expire)."""
    a, b = "public/default/a", "public/default/b"
    url = tmp_path.as_uri() if engine == "file" else shared_server().new_database_url()

    async def scenario() -> None:
        groups, logs = await _coordinator(url)
        for name in (a, b):
            logs.create_topic(name, 1, {})
        member, generation = await _stable_member(groups, "consumers", "consumer",
                                                  subscription(["a"]))
        assert await groups.commit(OFFSETS, "consumers", member, None, generation, [
            OffsetToCommit(t, 0, 7, -1, "", OWN_RETENTION_MS) for t in (a, b)]) == \
            (0, {(a, 0): 0, (b, 0): 0})
        assert await groups.commit(OFFSETS, "standalone", "", None, -1, [
            OffsetToCommit(a, 0, 7, -1, "", OWN_RETENTION_MS),
            OffsetToCommit(b, 0, 7, -1, "")]) == (0, {(a, 0): 0, (b, 0): 0})
        stamps = [c.commit_timestamp for g in ("consumers", "standalone")
                  for c in groups.committed(OFFSETS, g, None).values() if c is not None]
        await groups.stop()
        logs.close()

        again, logs = await _coordinator(url)  # a restart: the log's records replayed
        await again.expire_offsets(min(stamps) + OWN_RETENTION_MS - 1)
        for group_id in ("consumers", "standalone"):  # none is past its own retention yet
            assert set(again.committed(OFFSETS, group_id, None)) == {(a, 0), (b, 0)}
        await again.expire_offsets(max(stamps) + OWN_RETENTION_MS)
        assert set(again.committed(OFFSETS, "consumers", None)) == {(a, 0)}
        assert set(again.committed(OFFSETS, "standalone", None)) == {(b, 0)}
        await again.stop()
        logs.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("engine", ["file", "postgres"])
@pytest.mark.parametrize("first", ["commit", "delete"])
def test_offset_delete_racing_a_commit_answers_what_the_log_replays(tmp_path: Path,
                                                                   engine: str,
                                                                   first: str) -> None:
    """OffsetDelete (or a deleted topic's cleanup, or expiry: the same deletion) of a
    partition while a commit of it is being written, on an Empty group (a standalone
    committer, or an admin's alter-offsets). The log's order decides, in memory as on
    replay: a commit whose record precedes the tombstone is answered NONE and its offset
    is gone with the older one (as Kafka's ``removeOffsets`` clears
    ``pendingOffsetCommits``), one appended after the tombstone stays. What the
    coordinator answers before a restart (what OffsetFetch reads) is what a new
    coordinator replays. Each write here waits for its fsync or commit, so both are under
    way together."""
    tp = ("public/default/a", 0)
    url = tmp_path.as_uri() if engine == "file" else shared_server().new_database_url()

    def offsets(groups: GroupCoordinator) -> dict[tuple[str, int], int]:
        return {k: c.offset for k, c in groups.committed(OFFSETS, "standalone", None).items()
                if c is not None}

    async def scenario() -> None:
        groups, logs = await _coordinator(url)
        logs.create_topic(tp[0], 1, {})
        assert await groups.commit(OFFSETS, "standalone", "", None, -1,
                                   [OffsetToCommit(*tp, 5, -1, "")]) == (0, {tp: 0})
        group = groups.find(OFFSETS, "standalone")
        assert group is not None and group.state == GroupState.EMPTY

        def commit() -> asyncio.Future[tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]]:
            return asyncio.ensure_future(groups.commit(
                OFFSETS, "standalone", "", None, -1, [OffsetToCommit(*tp, 10, -1, "")]))

        def delete() -> asyncio.Future[None]:
            return asyncio.ensure_future(groups.delete_offsets(group, [tp]))

        earlier = commit() if first == "commit" else delete()
        await asyncio.sleep(0)  # its record is appended, its write not settled
        later = delete() if first == "commit" else commit()
        await asyncio.sleep(0)
        assert not earlier.done() and not later.done()
        assert tp in group.committing  # the commit was under way when the other appended
        await asyncio.gather(earlier, later)
        committing = earlier if first == "commit" else later
        assert committing.result() == (ErrorCode.NONE, {tp: ErrorCode.NONE})
        expected = {} if first == "commit" else {tp: 10}
        assert offsets(groups) == expected
        await groups.stop()
        logs.close()

        again, logs = await _coordinator(url)
        assert offsets(again) == expected
        await again.stop()
        logs.close()

    asyncio.run(scenario())


# -- real clients ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = start_broker(Path(tmp_path_factory.mktemp("kip496")),
                           offsetsRetentionMinutes="1", offsetsRetentionCheckIntervalMs="500")
    yield process
    process.stop()


def _committed(bootstrap: str, group: str, topics: list[str]) -> dict[tuple[str, int], int]:
    """The group's committed offsets of both partitions of ``topics``, as confluent-kafka's
    AdminClient lists them (OFFSET_INVALID where there is none)."""
    client = AdminClient({"bootstrap.servers": bootstrap})
    asked = [confluent_kafka.TopicPartition(t, p) for t in topics for p in range(2)]
    listed = client.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, asked)])[group].result(20)
    return {(tp.topic, tp.partition): tp.offset for tp in listed.topic_partitions}


def _topics_and_consumer(bootstrap: str, topic_name: str
                         ) -> tuple[str, str, str, confluent_kafka.Consumer]:
    """Topics A and B of two partitions with 5 records in each, the test's group, and a
    confluent-kafka consumer of that group (manual commits, from the earliest offset, a
    6 s session) not subscribed yet: (A, B, group, consumer)."""
    a, b = f"{topic_name}-a", f"{topic_name}-b"
    for name in (a, b):
        create_topic(bootstrap, name, 2)
        produce_values(bootstrap, name, range(2), 0, 5)
    group = group_id_for(topic_name)
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": group,
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000, "heartbeat.interval.ms": 250})
    return a, b, group, consumer


def _commit_as_member(port: int, group: str, member_id: str, topics: list[str],
                      offset: int) -> None:
    """Commit ``offset`` on both partitions of ``topics`` as the consumer ``member_id`` of
    ``group``, through OffsetCommit v2 with a retention of its own (OWN_RETENTION_MS; no
    client sends one any more), at the group's generation. No client call tells that
    generation: the broker refuses any other ILLEGAL_GENERATION, writing nothing, so it is
    tried from 1 up."""
    conn = GroupConnection(port)
    try:
        for generation in range(1, 100):
            first = conn.commit(group, generation, member_id, topics[0],
                                {0: (offset, ""), 1: (offset, "")}, version=2,
                                retention_ms=OWN_RETENTION_MS)
            if set(first.values()) != {ILLEGAL_GENERATION}:
                break
        assert first == {0: 0, 1: 0}, first
        for topic in topics[1:]:
            assert conn.commit(group, generation, member_id, topic,
                               {0: (offset, ""), 1: (offset, "")}, version=2,
                               retention_ms=OWN_RETENTION_MS) == {0: 0, 1: 0}
    finally:
        conn.close()


def test_a_stable_group_expires_the_offsets_of_a_topic_it_left(broker: BrokerProcess,
                                                                topic_name: str) -> None:
    """A confluent-kafka consumer subscribed to A and B commits on both, then subscribes to
    A only, and its offsets of both are committed again with a retention of their own
    (a second): once it has passed, B's offsets are gone while the group is Stable with the
    consumer in it; A's, committed alike, stay; after a restart B's stay gone."""
    a, b, group, consumer = _topics_and_consumer(broker.bootstrap, topic_name)
    seen: set[tuple[str | None, int | None, int | None]] = set()

    def read() -> None:
        for msg in consumer.consume(100, 0.2):
            assert msg.error() is None, msg.error()
            seen.add((msg.topic(), msg.partition(), msg.offset()))

    def assigned() -> set[str]:
        return {tp.topic for tp in consumer.assignment()}

    everything = {(a, 0): 5, (a, 1): 5, (b, 0): 5, (b, 1): 5}
    gone = confluent_kafka.OFFSET_INVALID
    try:
        consumer.subscribe([a, b])
        wait_until(lambda: len(seen) == 20, 60, "the records of A and B", read)
        consumer.commit(asynchronous=False)
        assert _committed(broker.bootstrap, group, [a, b]) == everything

        consumer.subscribe([a])  # a rebalance: the group's subscription is A alone
        wait_until(lambda: assigned() == {a}, 60, "A alone assigned", read)
        _commit_as_member(broker.port, group, consumer.memberid(), [a, b], 5)
        wait_until(lambda: _committed(broker.bootstrap, group, [b]) ==
                   {(b, 0): gone, (b, 1): gone}, 30, "B's offsets to expire", read)
        client = AdminClient({"bootstrap.servers": broker.bootstrap})
        described = client.describe_consumer_groups([group])[group].result(20)
        assert described.state == ConsumerGroupState.STABLE
        assert len(described.members) == 1
        assert _committed(broker.bootstrap, group, [a]) == {(a, 0): 5, (a, 1): 5}
        assert assigned() == {a}
    finally:
        consumer.close()
    assert broker.stop() == 0
    broker.start()
    assert _committed(broker.bootstrap, group, [a, b]) == {
        (a, 0): 5, (a, 1): 5, (b, 0): gone, (b, 1): gone}


def test_offset_delete_through_kafka_python_and_the_admin_cli(broker: BrokerProcess,
                                                               topic_name: str) -> None:
    """OffsetDelete on a Stable group subscribed to A: B's offsets go (kafka-python's
    KafkaAdminClient and ``edge-broker admin groups delete-offsets``), A's are refused
    GROUP_SUBSCRIBED_TO_TOPIC, a partition that does not exist is
    UNKNOWN_TOPIC_OR_PARTITION and an unknown group GROUP_ID_NOT_FOUND. (confluent-kafka's
    Python AdminClient has no call for OffsetDelete.)"""
    a, b, group, consumer = _topics_and_consumer(broker.bootstrap, topic_name)
    kadmin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)

    def poll() -> None:
        consumer.poll(0.2)

    try:
        consumer.subscribe([a])
        wait_until(lambda: {tp.topic for tp in consumer.assignment()} == {a}, 60,
                   "A assigned", poll)
        consumer.commit(offsets=[confluent_kafka.TopicPartition(t, p, 3)
                                 for t in (a, b) for p in range(2)], asynchronous=False)

        assert kadmin.delete_group_offsets(group, [TopicPartition(a, 0)]) == \
            {TopicPartition(a, 0): GroupSubscribedToTopicError}
        assert kadmin.delete_group_offsets(group, [TopicPartition(b, 0),
                                                   TopicPartition(b, 7)]) == \
            {TopicPartition(b, 0): NoError, TopicPartition(b, 7): UnknownTopicOrPartitionError}
        refused = admin(broker.bootstrap, "groups", "delete-offsets", group, "--topic", a,
                        output="json")
        assert refused.code == 1
        assert refused.json()["results"] == [
            {"topic": a, "partition": p, "result": "GROUP_SUBSCRIBED_TO_TOPIC"}
            for p in range(2)]
        done = admin(broker.bootstrap, "groups", "delete-offsets", group, "--topic", f"{b}:1",
                     output="json")
        assert done.code == 0, done.err
        assert done.json()["results"] == [{"topic": b, "partition": 1, "result": "NONE"}]
        gone = confluent_kafka.OFFSET_INVALID
        assert _committed(broker.bootstrap, group, [a, b]) == {
            (a, 0): 3, (a, 1): 3, (b, 0): gone, (b, 1): gone}

        with pytest.raises(GroupIdNotFoundError):
            kadmin.delete_group_offsets(f"{group}-never", [TopicPartition(b, 0)])
        unknown = admin(broker.bootstrap, "groups", "delete-offsets", f"{group}-never",
                        "--topic", f"{b}:0")
        assert unknown.code == 1 and "GROUP_ID_NOT_FOUND" in unknown.one_error_line()
    finally:
        kadmin.close()
        consumer.close()


def _refused_while_unknown(bootstrap: str, port: int, group: str, topic: str) -> None:
    """kafka-python's delete_group_offsets on ``group`` (whose subscriptions are unknown)
    gets GROUP_SUBSCRIBED_TO_TOPIC for both partitions of ``topic`` (not the group-level
    NON_EMPTY_GROUP), and the offsets committed on them stay."""
    kadmin = KafkaAdminClient(bootstrap_servers=bootstrap)
    conn = GroupConnection(port)
    try:
        assert kadmin.delete_group_offsets(group, [TopicPartition(topic, p)
                                                   for p in range(2)]) == {
            TopicPartition(topic, p): GroupSubscribedToTopicError for p in range(2)}
        assert conn.fetch_offsets(group, topic, [0, 1]) == (0, {0: (3, "", 0), 1: (3, "", 0)})
    finally:
        conn.close()
        kadmin.close()


def _commit_standalone(port: int, group: str, topic: str) -> None:
    """Offset 3 on both partitions of ``topic``, committed for ``group`` without members."""
    conn = GroupConnection(port)
    try:
        assert conn.commit(group, -1, "", topic, {0: (3, ""), 1: (3, "")}) == {0: 0, 1: 0}
    finally:
        conn.close()


def test_offset_delete_while_a_member_subscription_cannot_be_read(broker: BrokerProcess,
                                                                 topic_name: str) -> None:
    """A Stable consumer group whose member's subscription cannot be read: OffsetDelete
    is refused per partition, as Kafka's ``isSubscribedToTopic`` answers an unknown
    subscription (it may well name the topic)."""
    create_topic(broker.bootstrap, topic_name, 2)
    group = group_id_for(topic_name)
    _commit_standalone(broker.port, group, topic_name)
    member = GroupConnection(broker.port, timeout=20)
    try:
        joined = member.join_new(group, metadata=b"\x00\x07garbage")
        assert joined.error_code == 0, joined
        synced = member.sync(group, joined.generation_id, joined.member_id,
                             {joined.member_id: b""})
        assert synced.error_code == 0, synced
        _refused_while_unknown(broker.bootstrap, broker.port, group, topic_name)
        assert member.leave(group, [(joined.member_id, None)]).error_code == 0
    finally:
        member.close()


def test_offset_delete_during_a_first_rebalance(tmp_path: Path, topic_name: str) -> None:
    """A consumer group in its first rebalance (a member's JoinGroup waits for
    ``groupInitialRebalanceDelayMs``, a minute here: no protocol chosen yet, so no
    subscription known): OffsetDelete is refused per partition, as Kafka does."""
    process = start_broker(tmp_path, groupInitialRebalanceDelayMs="60000")
    try:
        create_topic(process.bootstrap, topic_name, 2)
        group = group_id_for(topic_name)
        _commit_standalone(process.port, group, topic_name)
        waiter, answers = join_in_thread(process.port, group, version=3,
                                         topics=(topic_name,), rebalance_ms=60_000)
        client = AdminClient({"bootstrap.servers": process.bootstrap})

        def preparing() -> bool:
            described = client.describe_consumer_groups([group])[group].result(20)
            return bool(described.state == ConsumerGroupState.PREPARING_REBALANCING
                        and described.members)

        wait_until(preparing, 30, "the member to wait in the first rebalance")
        _refused_while_unknown(process.bootstrap, process.port, group, topic_name)
    finally:
        process.stop()
    waiter.join(20)
    assert answers and answers[0].error_code == NOT_COORDINATOR, answers
