"""The registry in PostgreSQL, two brokers' storages on one database, no broker process:
leases, claims, hand-overs and fencing, step by step (no timing races)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from broker_core.cluster.placement import assign
from broker_core.cluster.reconcile import ClusterConfig
from broker_core.cluster.service import ClusterService
from broker_core.cluster.slots import BrokerSlots
from broker_core.storage import LogConfig, open_storage
from broker_core.storage.cluster import BrokerIdInUse, BrokerRecord, ListenerAddress, NotOwner
from broker_core.storage.errors import AppendFenced
from broker_core.storage.postgres import PgStorage
from tests.batches import make_batch
from tests.broker_process import REPO, BrokerProcess
from tests.postgres_server import shared_server
from tests.storage_helpers import headed

TOPIC = "public/default/t"
OTHER = "public/default/u"
SHORT_LEASE_MS = 600


def record(broker_id: int) -> BrokerRecord:
    return BrokerRecord(broker_id, f"rack-{broker_id}", (
        ListenerAddress("PLAINTEXT", "PLAINTEXT", "adv.example", 9092 + broker_id,
                        "127.0.0.1", 19092 + broker_id),))


@pytest.fixture
def pair() -> Iterator[tuple[PgStorage, PgStorage]]:
    url = shared_server().new_database_url()
    first = open_storage(url, LogConfig())
    second = open_storage(url, LogConfig())
    assert isinstance(first, PgStorage) and isinstance(second, PgStorage)
    first.create_topic(TOPIC, 2, {})
    yield first, second
    first.close()
    second.close()


def append(storage: PgStorage, index: int = 0) -> int:
    found = storage.partition(TOPIC, index)
    assert found is not None
    return found.append(*headed(make_batch(1)))


def test_a_broker_id_is_registered_once_while_its_lease_runs(
        pair: tuple[PgStorage, PgStorage]) -> None:
    first, second = pair
    first.cluster.register(record(0), SHORT_LEASE_MS)
    with pytest.raises(BrokerIdInUse, match="broker id 0"):
        second.cluster.register(record(0), SHORT_LEASE_MS)
    second.cluster.register(record(1), SHORT_LEASE_MS)
    live = second.cluster.view().live
    assert sorted(live) == [0, 1] and live[0] == record(0)  # listeners and rack kept
    time.sleep(SHORT_LEASE_MS / 1000 + 0.3)
    assert second.cluster.view().live == {}  # both leases ran out
    assert not first.cluster.heartbeat(SHORT_LEASE_MS).renewed  # told it was declared dead
    second.cluster.register(record(0), SHORT_LEASE_MS)  # the id is free again


def test_a_partition_has_one_writer_and_a_late_one_is_fenced(
        pair: tuple[PgStorage, PgStorage]) -> None:
    first, second = pair
    first.cluster.register(record(0), SHORT_LEASE_MS)
    second.cluster.register(record(1), 60_000)
    assert first.cluster.claim([(TOPIC, 0)]) == {(TOPIC, 0): 1}
    assert second.cluster.claim([(TOPIC, 0)]) == {}  # its owner is live
    with pytest.raises(NotOwner):
        append(second)  # registered, not the owner: refused before the database
    assert append(first) == 0
    time.sleep(SHORT_LEASE_MS / 1000 + 0.3)  # the first broker "pauses" past its lease
    assert second.cluster.claim([(TOPIC, 0)]) == {(TOPIC, 0): 2}
    assert append(second) == 1
    with pytest.raises(NotOwner):  # the paused owner wakes up: its epoch is stale
        append(first)
    assert first.cluster.claim([(TOPIC, 0)]) == {}  # and it cannot claim back, its
    assert second.cluster.view().owners[(TOPIC, 0)].epoch == 2  # lease having run out
    found = second.partition(TOPIC, 0)
    assert found is not None and found.next_offset == 2  # nothing of the late write


def test_a_late_owners_queued_append_is_fenced_at_commit(
        pair: tuple[PgStorage, PgStorage]) -> None:
    """The append a paused owner queued before it learns of the takeover: its commit finds
    the newer epoch and fails as AppendFenced (answered NOT_LEADER_OR_FOLLOWER), not as a
    storage fault, and nothing of it is stored."""
    first, second = pair
    first.cluster.register(record(0), SHORT_LEASE_MS)
    second.cluster.register(record(1), 60_000)
    assert first.cluster.claim([(TOPIC, 0)]) == {(TOPIC, 0): 1}
    time.sleep(SHORT_LEASE_MS / 1000 + 0.3)
    assert second.cluster.claim([(TOPIC, 0)]) == {(TOPIC, 0): 2}
    late = first.partition(TOPIC, 0)
    assert late is not None

    async def commit_late() -> None:
        _, commit = late.append_deferred(*headed(make_batch(1)))
        await commit

    with pytest.raises(AppendFenced):
        asyncio.run(commit_late())
    assert append(second) == 0  # the late batch took no offset


def test_a_hand_over_moves_the_epoch_and_stops_the_giver(
        pair: tuple[PgStorage, PgStorage]) -> None:
    first, second = pair
    first.cluster.register(record(0), 60_000)
    second.cluster.register(record(1), 60_000)
    assert first.cluster.claim([(TOPIC, 1)]) == {(TOPIC, 1): 1}
    first.cluster.drop([(TOPIC, 1)])
    assert first.cluster.hand_over({(TOPIC, 1): (1, 1)}) == [(TOPIC, 1)]
    assert second.cluster.view().owners[(TOPIC, 1)].broker_id == 1
    with pytest.raises(NotOwner):
        append(first, 1)
    assert second.cluster.claim([(TOPIC, 1)]) == {(TOPIC, 1): 3}  # handed here: adopted
    assert append(second, 1) == 0
    assert first.cluster.hand_over({(TOPIC, 1): (1, 0)}) == []  # a stale epoch moves nothing


def test_metadata_names_the_epoch_the_claim_it_triggers_takes(
        pair: tuple[PgStorage, PgStorage]) -> None:
    """A partition nobody live owns is announced on the broker that will claim it, at the
    epoch that claim takes: a client sent there with that epoch is served once the claim
    is done, not fenced by it (librdkafka's admin ListOffsets gave up on such a fence)."""
    first, second = pair
    first.cluster.register(record(0), 60_000)
    second.cluster.register(record(1), 60_000)
    assert first.cluster.claim([(TOPIC, 0), (TOPIC, 1)]) == {(TOPIC, 0): 1, (TOPIC, 1): 1}
    first.cluster.drop([(TOPIC, 1)])
    assert first.cluster.hand_over({(TOPIC, 1): (1, 1)}) == [(TOPIC, 1)]  # at epoch 2
    first.cluster.deregister()  # partition 0's owner is gone, at epoch 1
    second.create_topic(OTHER, 1, {})  # never owned: epoch 0 in the registry
    service = ClusterService(second.cluster, record(1), ClusterConfig(), second.topics,
                             second.kv)
    service.view = second.cluster.view()
    service.lease.renewed_at = time.monotonic()  # as after a heartbeat
    announced = {key: service.leader(*key, 2) for key in ((TOPIC, 0), (TOPIC, 1), (OTHER, 0))}
    assert {key: leader.broker_id for key, leader in announced.items()
            if leader is not None} == dict.fromkeys(announced, 1)
    taken = second.cluster.claim(list(announced))
    assert {key: leader.epoch for key, leader in announced.items()
            if leader is not None} == taken == {(TOPIC, 0): 2, (TOPIC, 1): 3, (OTHER, 0): 1}


def test_a_broker_cut_off_from_the_registry_names_the_others_for_what_it_gave_up(
        pair: tuple[PgStorage, PgStorage]) -> None:
    """A broker whose lease ran out (cut off from the database, it gave its partitions up)
    announces none of them as its own: each goes to the broker the others place it on once
    they see it gone, at the epoch their claim takes (a client sent back to it would only
    be refused, over and over, while the others could serve)."""
    first, second = pair
    first.create_topic(OTHER, 12, {})
    for broker_id in (0, 1, 2):
        first.cluster.register(record(broker_id), 60_000)
    partitions = [(OTHER, index) for index in range(12)]
    claimed = first.cluster.claim(partitions)  # owned by broker 2 in the registry ...
    service = ClusterService(second.cluster, record(2), ClusterConfig(), second.topics,
                             second.kv)
    service.view = second.cluster.view()  # ... as broker 2 last read it, owning none now
    service.lease.renewed_at = time.monotonic()
    fresh = [service.leader(*key, 12) for key in partitions]
    assert [leader.broker_id for leader in fresh if leader is not None] == \
        list(assign(OTHER, 12, [0, 1, 2]))  # its lease runs: placed among all three
    service.lease.renewed_at = time.monotonic() - ClusterConfig().session_timeout_ms / 1000 - 1
    cut_off = [service.leader(*key, 12) for key in partitions]
    assert [leader.broker_id for leader in cut_off if leader is not None] == \
        list(assign(OTHER, 12, [0, 1]))
    assert [leader.epoch for leader in cut_off if leader is not None] == \
        [claimed[key] + 1 for key in partitions]


def test_placement_is_balanced_and_moves_little() -> None:
    three = assign("tenant/ns/topic", 12, [0, 1, 2])
    assert sorted(three.count(b) for b in (0, 1, 2)) == [4, 4, 4]
    assert assign("tenant/ns/topic", 12, [2, 1, 0]) == three  # the same on every broker
    two = assign("tenant/ns/topic", 12, [0, 2])
    kept = sum(1 for before, after in zip(three, two, strict=True)
               if before != 1 and before == after)
    assert kept >= 6, (three, two)  # most partitions of live brokers stay where they were
    assert sorted(two.count(b) for b in (0, 2)) == [6, 6]


def test_slots_are_small_kept_while_live_and_reused_after_death(
        pair: tuple[PgStorage, PgStorage]) -> None:
    first, second = (BrokerSlots(storage.kv) for storage in pair)
    assert first.take(1001, {1001}) == 0
    assert second.take(5, {5, 1001}) == 1
    assert first.take(1001, {5, 1001}) == 0  # a broker keeps its slot (a restart too)
    assert second.take(77, {77, 5}) == 0  # 1001 is dead: its slot is reused
    assert first.take(1001, {77, 5, 1001}) == 2  # back, its old slot taken: a new one
    assert first.read() == second.read() == {0: 77, 1: 5, 2: 1001}


def test_brokers_taking_slots_at_once_never_share_one(pair: tuple[PgStorage, PgStorage]
                                                      ) -> None:
    views = [BrokerSlots(storage.kv) for storage in pair]
    ids = list(range(100, 116))
    with ThreadPoolExecutor(8) as pool:
        slots = list(pool.map(lambda b: views[b % 2].take(b, set(ids)), ids))
    assert sorted(slots) == list(range(len(ids)))
    assert views[0].read() == dict(zip(slots, ids, strict=True))


def test_a_failed_first_start_leaves_a_schema_another_broker_uses() -> None:
    url = shared_server().new_database_url()
    creator = open_storage(url, LogConfig())  # creates the schema, then fails to start
    peer = open_storage(url, LogConfig())
    assert isinstance(peer, PgStorage)
    peer.cluster.register(record(1), 60_000)
    creator.discard_created()
    assert sorted(peer.cluster.view().live) == [1]  # the tables are still there
    peer.close()
    other_url = shared_server().new_database_url()
    alone = open_storage(other_url, LogConfig())
    alone.discard_created()  # nobody else: the schema it created goes
    with psycopg.connect(other_url) as conn:
        assert conn.execute("SELECT to_regclass('edge_topics')").fetchone() == (None,)


def test_a_broker_taking_a_partition_over_sees_what_its_owner_wrote(
        pair: tuple[PgStorage, PgStorage]) -> None:
    first, second = pair
    second.partition(TOPIC, 0)  # cached before the first broker writes
    first.cluster.register(record(0), SHORT_LEASE_MS)
    second.cluster.register(record(1), 60_000)
    first.cluster.claim([(TOPIC, 0)])
    assert [append(first) for _ in range(3)] == [0, 1, 2]
    time.sleep(SHORT_LEASE_MS / 1000 + 0.3)
    assert second.cluster.claim([(TOPIC, 0)]) == {(TOPIC, 0): 2}
    found = second.partition(TOPIC, 0)
    assert found is not None and found.next_offset == 3
    assert [info.base_offset for info in found.batches_from(0)] == [0, 1, 2]
    assert append(second) == 3


def test_a_second_broker_with_a_live_id_stops_with_one_clear_line(tmp_path: Path) -> None:
    """A broker id is one broker: a second process started with the id of a live one waits
    out one session (a killed predecessor's lease would run out meanwhile), then stops with
    exit code 2 and a line naming the id; the live broker serves on."""
    url = shared_server().new_database_url()
    settings = {"storageUrl": url, "brokerSessionTimeoutMs": "1000",
                "brokerHeartbeatIntervalMs": "250"}
    first = BrokerProcess(tmp_path / "a", settings).start()
    try:
        second = subprocess.run(
            [sys.executable, "-m", "edge.cli", "--set", "kafkaListeners=PLAINTEXT://127.0.0.1:0",
             *(arg for key, value in settings.items() for arg in ("--set", f"{key}={value}"))],
            cwd=REPO, capture_output=True, text=True, timeout=60)
        assert second.returncode == 2, second.stderr
        assert "broker id 0 is registered by a live broker" in second.stderr
        assert first.alive()
        admin = AdminClient({"bootstrap.servers": first.bootstrap})
        assert set(admin.list_topics(timeout=10).brokers) == {0}
    finally:
        first.stop()
