"""Acceptance 5 (groups): exact group requests over a raw connection. Commits from unknown
generations or members, heartbeats from expelled members, over-long group ids and offset
metadata get Kafka's error codes and change nothing; the JoinGroup v4+ two-step, session
timeout bounds, static-member fencing, SyncGroup generations and heartbeats during a
rebalance behave as on Kafka; FindCoordinator and multi-group OffsetFetch answer."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.consumer import ConsumerProtocolAssignment

from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.group_helpers import (
    FENCED_INSTANCE_ID,
    ILLEGAL_GENERATION,
    INCONSISTENT_GROUP_PROTOCOL,
    INVALID_GROUP_ID,
    INVALID_SESSION_TIMEOUT,
    MEMBER_ID_REQUIRED,
    NONE,
    OFFSET_METADATA_TOO_LARGE,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
    GroupConnection,
    assignment,
    group_id_for,
    join_in_thread,
    start_broker,
    subscription,
)

MIN_SESSION_MS = 1000
MAX_SESSION_MS = 60_000


@pytest.fixture(scope="module")
def gbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker with no initial rebalance delay and session timeouts in [1 s, 60 s]."""
    process = start_broker(Path(tmp_path_factory.mktemp("groups-raw")),
                           groupInitialRebalanceDelayMs="0",
                           groupMinSessionTimeoutMs=str(MIN_SESSION_MS),
                           groupMaxSessionTimeoutMs=str(MAX_SESSION_MS))
    yield process
    process.stop()


@pytest.fixture
def conn(gbroker: BrokerProcess) -> Iterator[GroupConnection]:
    connection = GroupConnection(gbroker.port, timeout=20)
    yield connection
    connection.close()


def stable_member(conn: GroupConnection, group: str, topic: str, partitions: int = 2,
                  **kwargs: object) -> tuple[str, int]:
    """Join ``group`` alone, sync an assignment of every partition; return (member, gen)."""
    joined = conn.join_new(group, topics=(topic,), **kwargs)  # type: ignore[arg-type]
    assert joined.error_code == NONE, joined
    assert joined.leader == joined.member_id
    synced = conn.sync(group, joined.generation_id, joined.member_id,
                       {joined.member_id: assignment(topic, range(partitions))},
                       instance_id=kwargs.get("instance_id"))  # type: ignore[arg-type]
    assert synced.error_code == NONE, synced
    return joined.member_id, joined.generation_id


def test_find_coordinator_every_version(gbroker: BrokerProcess, conn: GroupConnection,
                                        topic_name: str) -> None:
    group = group_id_for(topic_name)
    for version in range(4):
        answer = conn.find_coordinator([group], version)
        assert answer.error_code == NONE, (version, answer)
        assert (answer.node_id, answer.host, answer.port) == (0, "127.0.0.1", gbroker.port)
    batched = conn.find_coordinator([group, group + "-2", "x"], 4)
    assert [c.key for c in batched.coordinators] == [group, group + "-2", "x"]
    for coordinator in batched.coordinators:
        assert coordinator.error_code == NONE, coordinator
        assert (coordinator.node_id, coordinator.host, coordinator.port) == \
            (0, "127.0.0.1", gbroker.port)


@pytest.mark.parametrize("version", [4, 6, 9])
def test_join_v4_plus_needs_a_member_id_first(conn: GroupConnection, topic_name: str,
                                              version: int) -> None:
    group = group_id_for(topic_name)
    first = conn.join(group, "", version=version, topics=(topic_name,))
    assert first.error_code == MEMBER_ID_REQUIRED, first
    assert first.member_id != ""
    second = conn.join(group, first.member_id, version=version, topics=(topic_name,))
    assert second.error_code == NONE, second
    assert second.member_id == first.member_id
    assert second.leader == first.member_id
    assert second.generation_id == 1
    assert second.protocol_name == "range"
    assert [(m.member_id, bytes(m.metadata)) for m in second.members] == \
        [(first.member_id, subscription([topic_name]))]
    mine = assignment(topic_name, [0, 1])
    synced = conn.sync(group, 1, first.member_id, {first.member_id: mine},
                       version=min(version, 5))
    assert synced.error_code == NONE, synced
    assert bytes(synced.assignment) == mine
    assert ConsumerProtocolAssignment.decode(bytes(synced.assignment)).partitions() == [
        (topic_name, 0), (topic_name, 1)]
    assert conn.heartbeat(group, 1, first.member_id, version=min(version, 4)) == NONE


@pytest.mark.parametrize("version", [0, 3])
def test_join_before_v4_gets_a_member_id_at_once(conn: GroupConnection, topic_name: str,
                                                 version: int) -> None:
    group = group_id_for(topic_name)
    joined = conn.join(group, "", version=version, topics=(topic_name,))
    assert joined.error_code == NONE, joined
    assert joined.member_id != ""
    assert joined.leader == joined.member_id
    assert joined.generation_id == 1


def test_session_timeout_outside_the_bounds(conn: GroupConnection, topic_name: str) -> None:
    group = group_id_for(topic_name)
    for session_ms in (MIN_SESSION_MS - 1, MAX_SESSION_MS + 1, 0):
        for version in (3, 5):
            answer = conn.join(group, "", version=version, session_ms=session_ms,
                               topics=(topic_name,))
            assert answer.error_code == INVALID_SESSION_TIMEOUT, (session_ms, version, answer)
    joined = conn.join_new(group, session_ms=MIN_SESSION_MS, topics=(topic_name,))
    assert joined.error_code == NONE, joined
    joined_max = conn.join_new(group + "-max", session_ms=MAX_SESSION_MS,
                               topics=(topic_name,))
    assert joined_max.error_code == NONE, joined_max


def test_over_long_group_id_is_invalid_and_changes_nothing(gbroker: BrokerProcess,
                                                          conn: GroupConnection,
                                                          topic_name: str) -> None:
    create_topic(gbroker.bootstrap, topic_name, 2)
    longest = ("g" + topic_name + "x" * 255)[:255]
    too_long = longest + "y"
    assert conn.commit(longest, -1, "", topic_name, {0: (3, None)}) == {0: NONE}
    joined = conn.join_new(longest, topics=(topic_name,))
    assert joined.error_code == NONE, joined

    assert conn.join(too_long, "", version=3, topics=(topic_name,)).error_code == \
        INVALID_GROUP_ID
    assert conn.join(too_long, "", version=9, topics=(topic_name,)).error_code == \
        INVALID_GROUP_ID
    assert conn.join("", "", version=5, topics=(topic_name,)).error_code == INVALID_GROUP_ID
    for version in (2, 8):
        assert conn.commit(too_long, -1, "", topic_name, {0: (9, None), 1: (9, None)},
                           version=version) == {0: INVALID_GROUP_ID, 1: INVALID_GROUP_ID}
    for version in (7, 8):
        error, _ = conn.fetch_offsets(too_long, topic_name, [0, 1], version=version)
        assert error == INVALID_GROUP_ID, version
    error, offsets = conn.fetch_offsets(longest, topic_name, [0, 1])
    assert error == NONE
    assert offsets[0][0] == 3
    assert offsets[1][0] == -1


@pytest.mark.parametrize("version", [2, 5, 8])
def test_commit_from_unknown_generation_or_member_changes_nothing(
        gbroker: BrokerProcess, conn: GroupConnection, topic_name: str, version: int) -> None:
    create_topic(gbroker.bootstrap, topic_name, 2)
    group = group_id_for(topic_name)
    member, generation = stable_member(conn, group, topic_name)
    assert conn.commit(group, generation, member, topic_name, {0: (5, "good"), 1: (6, "")},
                       version=version) == {0: NONE, 1: NONE}

    wrong_gen = conn.commit(group, generation + 1, member, topic_name, {0: (50, "bad")},
                            version=version)
    assert wrong_gen == {0: ILLEGAL_GENERATION}
    unknown = conn.commit(group, generation, "no-such-member", topic_name, {0: (60, "bad")},
                          version=version)
    assert unknown == {0: UNKNOWN_MEMBER_ID}

    never = group + "-never"
    assert conn.commit(never, generation, member, topic_name, {0: (70, "bad")},
                       version=version) == {0: ILLEGAL_GENERATION}

    for fetch_version in range(1, 10):
        error, offsets = conn.fetch_offsets(group, topic_name, [0, 1], version=fetch_version)
        assert error == NONE
        assert offsets == {0: (5, "good", NONE), 1: (6, "", NONE)}, fetch_version
    assert conn.fetch_offsets(never, topic_name, [0])[1] == {0: (-1, "", NONE)}
    assert conn.heartbeat(group, generation, member) == NONE


def test_offset_metadata_over_the_limit_fails_only_that_partition(
        gbroker: BrokerProcess, conn: GroupConnection, topic_name: str) -> None:
    create_topic(gbroker.bootstrap, topic_name, 3)
    group = group_id_for(topic_name)
    assert conn.commit(group, -1, "", topic_name, {0: (5, "before"), 1: (6, "before")}) == \
        {0: NONE, 1: NONE}
    answer = conn.commit(group, -1, "", topic_name, {
        0: (50, "m" * 4097), 1: (60, "ok"), 2: (70, "n" * 4096)})
    assert answer == {0: OFFSET_METADATA_TOO_LARGE, 1: NONE, 2: NONE}
    error, offsets = conn.fetch_offsets(group, topic_name, [0, 1, 2])
    assert error == NONE
    assert offsets == {0: (5, "before", NONE), 1: (60, "ok", NONE), 2: (70, "n" * 4096, NONE)}
    member, generation = stable_member(conn, group, topic_name, 3)
    assert conn.commit(group, generation, member, topic_name, {1: (61, "x" * 5000)}) == \
        {1: OFFSET_METADATA_TOO_LARGE}
    assert conn.fetch_offsets(group, topic_name, [1])[1] == {1: (60, "ok", NONE)}


@pytest.mark.parametrize("leave_version", [0, 3, 5])
def test_member_removed_by_leave_group_is_unknown(gbroker: BrokerProcess,
                                                  conn: GroupConnection, topic_name: str,
                                                  leave_version: int) -> None:
    create_topic(gbroker.bootstrap, topic_name, 2)
    group = group_id_for(topic_name)
    member, generation = stable_member(conn, group, topic_name)
    assert conn.commit(group, generation, member, topic_name, {0: (4, None)}) == {0: NONE}
    left = conn.leave(group, [(member, None)], version=leave_version)
    assert left.error_code == NONE, left
    if leave_version >= 3:
        assert [(m.member_id, m.error_code) for m in left.members] == [(member, NONE)]
    assert conn.heartbeat(group, generation, member) == UNKNOWN_MEMBER_ID
    assert conn.commit(group, generation, member, topic_name, {0: (40, None)}) == \
        {0: UNKNOWN_MEMBER_ID}
    assert conn.fetch_offsets(group, topic_name, [0])[1] == {0: (4, "", NONE)}
    again = conn.leave(group, [(member, None)], version=leave_version)
    if leave_version >= 3:
        assert again.error_code == NONE
        assert [(m.member_id, m.error_code) for m in again.members] == \
            [(member, UNKNOWN_MEMBER_ID)]
    else:
        assert again.error_code == UNKNOWN_MEMBER_ID


def test_member_expelled_by_session_timeout_is_unknown(gbroker: BrokerProcess,
                                                       conn: GroupConnection,
                                                       topic_name: str) -> None:
    create_topic(gbroker.bootstrap, topic_name, 2)
    group = group_id_for(topic_name)
    member, generation = stable_member(conn, group, topic_name, session_ms=MIN_SESSION_MS)
    assert conn.commit(group, generation, member, topic_name, {0: (4, "kept")}) == {0: NONE}
    for _ in range(3):  # heartbeats within the session keep it alive
        time.sleep(MIN_SESSION_MS / 3000)
        assert conn.heartbeat(group, generation, member) == NONE
    time.sleep(MIN_SESSION_MS * 2.5 / 1000)
    assert conn.heartbeat(group, generation, member) == UNKNOWN_MEMBER_ID
    assert conn.commit(group, generation, member, topic_name, {0: (40, None)}) == \
        {0: UNKNOWN_MEMBER_ID}
    assert conn.fetch_offsets(group, topic_name, [0])[1] == {0: (4, "kept", NONE)}


@pytest.mark.parametrize("who", ["leader", "leader-v9", "follower"])
def test_static_member_rejoining_fences_the_old_member_id(gbroker: BrokerProcess,
                                                          conn: GroupConnection,
                                                          topic_name: str, who: str) -> None:
    create_topic(gbroker.bootstrap, topic_name, 2)
    group = group_id_for(topic_name)
    first = conn.join(group, "", version=5, instance_id="instance-a", topics=(topic_name,))
    assert first.error_code == NONE, first  # static members skip MEMBER_ID_REQUIRED
    member_a = first.member_id
    assert member_a != ""
    generation = first.generation_id
    plan = {member_a: assignment(topic_name, [0, 1])}
    if who == "follower":  # a second static member joins; A rejoins; both sync
        thread, out = join_in_thread(gbroker.port, group, "", version=5,
                                     instance_id="instance-b", topics=(topic_name,))
        time.sleep(0.3)
        rejoined = conn.join(group, member_a, version=5, instance_id="instance-a",
                             topics=(topic_name,))
        thread.join(15)
        assert rejoined.error_code == NONE, rejoined
        assert len(out) == 1 and out[0].error_code == NONE, out
        generation = rejoined.generation_id
        assert rejoined.leader == member_a
        plan = {member_a: assignment(topic_name, [0]),
                out[0].member_id: assignment(topic_name, [1])}
    synced = conn.sync(group, generation, member_a, plan, instance_id="instance-a")
    assert synced.error_code == NONE, synced
    instance, old = "instance-a", member_a
    if who == "follower":
        instance, old = "instance-b", out[0].member_id
        other = GroupConnection(gbroker.port)
        synced_b = other.sync(group, generation, old, instance_id=instance)
        other.close()
        assert synced_b.error_code == NONE, synced_b
        assert bytes(synced_b.assignment) == plan[old]
    assert conn.heartbeat(group, generation, old, instance_id=instance) == NONE

    second = conn.join(group, "", version=9 if who == "leader-v9" else 5,
                       instance_id=instance, topics=(topic_name,))
    assert second.error_code == NONE, second
    new = second.member_id
    assert new not in ("", old)
    if who == "leader-v9":  # KIP-814: the rejoined leader is told to skip the assignment
        assert second.skip_assignment is True
        assert second.leader == new
        assert [m.member_id for m in second.members] == [new]
    elif who == "leader":  # below v9, as Kafka: told its old id leads, it acts as follower
        assert second.leader == old
        assert second.members == []
    assert conn.heartbeat(group, generation, old, instance_id=instance) == FENCED_INSTANCE_ID
    assert conn.commit(group, generation, old, topic_name, {0: (9, None)},
                       instance_id=instance) == {0: FENCED_INSTANCE_ID}
    # Kafka: a static member (leader or not) rejoining a Stable group with unchanged
    # protocols triggers no rebalance; it gets the current generation and its assignment.
    assert second.generation_id == generation
    assert conn.heartbeat(group, generation, new, instance_id=instance) == NONE
    again = conn.sync(group, generation, new, instance_id=instance)
    assert again.error_code == NONE, again
    assert bytes(again.assignment) == plan[old]
    assert conn.commit(group, generation, new, topic_name, {0: (7, None)},
                       instance_id=instance) == {0: NONE}
    assert conn.fetch_offsets(group, topic_name, [0])[1] == {0: (7, "", NONE)}


def test_sync_with_a_wrong_generation(conn: GroupConnection, topic_name: str) -> None:
    group = group_id_for(topic_name)
    joined = conn.join_new(group, topics=(topic_name,))
    assert joined.error_code == NONE, joined
    member = joined.member_id
    mine = {member: assignment(topic_name, [0])}
    assert conn.sync(group, joined.generation_id + 1, member, mine).error_code == \
        ILLEGAL_GENERATION
    assert conn.sync(group, joined.generation_id, "stranger", mine).error_code == \
        UNKNOWN_MEMBER_ID
    synced = conn.sync(group, joined.generation_id, member, mine)
    assert synced.error_code == NONE, synced
    assert bytes(synced.assignment) == mine[member]
    assert conn.heartbeat(group, joined.generation_id + 1, member) == ILLEGAL_GENERATION
    assert conn.heartbeat(group, joined.generation_id, member) == NONE


def test_heartbeat_during_a_rebalance(gbroker: BrokerProcess, conn: GroupConnection,
                                      topic_name: str) -> None:
    group = group_id_for(topic_name)
    member_a, gen1 = stable_member(conn, group, topic_name)
    pending = conn.join(group, "", version=5, topics=(topic_name,))
    assert pending.error_code == MEMBER_ID_REQUIRED
    member_b = pending.member_id
    thread, out = join_in_thread(gbroker.port, group, member_b, version=5,
                                 topics=(topic_name,))
    deadline = time.monotonic() + 10
    code = conn.heartbeat(group, gen1, member_a)
    while code == NONE and time.monotonic() < deadline:
        time.sleep(0.05)
        code = conn.heartbeat(group, gen1, member_a)
    assert code == REBALANCE_IN_PROGRESS
    assert not out, "B's join must wait for A to rejoin"
    rejoined = conn.join(group, member_a, version=5, topics=(topic_name,))
    thread.join(15)
    assert rejoined.error_code == NONE, rejoined
    assert len(out) == 1 and not isinstance(out[0], Exception), out
    joined_b = out[0]
    assert joined_b.error_code == NONE, joined_b
    assert rejoined.generation_id == joined_b.generation_id == gen1 + 1
    assert rejoined.leader == joined_b.leader == member_a
    assert sorted(m.member_id for m in rejoined.members) == sorted([member_a, member_b])
    assert joined_b.members == []
    gen2 = rejoined.generation_id
    plan = {member_a: assignment(topic_name, [0]), member_b: assignment(topic_name, [1])}
    assert conn.sync(group, gen2, member_a, plan).error_code == NONE
    other = GroupConnection(gbroker.port)
    try:
        synced_b = other.sync(group, gen2, member_b)
        assert synced_b.error_code == NONE, synced_b
        assert bytes(synced_b.assignment) == plan[member_b]
        assert other.heartbeat(group, gen2, member_b) == NONE
    finally:
        other.close()
    assert conn.heartbeat(group, gen2, member_a) == NONE
    assert conn.heartbeat(group, gen1, member_a) == ILLEGAL_GENERATION


def test_offset_fetch_for_several_groups_at_once(gbroker: BrokerProcess,
                                                 conn: GroupConnection,
                                                 topic_name: str) -> None:
    from kafka.protocol.consumer import OffsetFetchRequest, OffsetFetchResponse

    create_topic(gbroker.bootstrap, topic_name, 2)
    g1, g2, g3 = (group_id_for(topic_name, s) for s in ("a", "b", "never"))
    assert conn.commit(g1, -1, "", topic_name, {0: (11, "one")}) == {0: NONE}
    assert conn.commit(g2, -1, "", topic_name, {0: (21, None), 1: (22, "two")}) == \
        {0: NONE, 1: NONE}
    group_cls = OffsetFetchRequest.OffsetFetchRequestGroup
    topics = [group_cls.OffsetFetchRequestTopics(name=topic_name, partition_indexes=[0, 1])]
    for version in (8, 9):
        request = OffsetFetchRequest[version](groups=[
            group_cls(group_id=g1, topics=topics), group_cls(group_id=g2, topics=None),
            group_cls(group_id=g3, topics=topics)], require_stable=False)
        answer = conn.call(request, version, OffsetFetchResponse)
        by_group = {
            g.group_id: (g.error_code, {(t.name, p.partition_index): (p.committed_offset,
                                                                      p.error_code)
                                        for t in g.topics for p in t.partitions})
            for g in answer.groups}
        assert by_group[g1] == (NONE, {(topic_name, 0): (11, NONE), (topic_name, 1): (-1, NONE)})
        assert by_group[g2] == (NONE, {(topic_name, 0): (21, NONE), (topic_name, 1): (22, NONE)})
        assert by_group[g3] == (NONE, {(topic_name, 0): (-1, NONE), (topic_name, 1): (-1, NONE)})


def test_batched_leave_group(gbroker: BrokerProcess, conn: GroupConnection,
                             topic_name: str) -> None:
    create_topic(gbroker.bootstrap, topic_name, 2)
    group = group_id_for(topic_name)
    first = conn.join(group, "", version=5, instance_id="static-a", topics=(topic_name,))
    assert first.error_code == NONE, first
    member_a = first.member_id
    pending = conn.join(group, "", version=5, topics=(topic_name,))
    assert pending.error_code == MEMBER_ID_REQUIRED
    thread, out = join_in_thread(gbroker.port, group, pending.member_id, version=5,
                                 topics=(topic_name,))
    time.sleep(0.3)
    rejoined = conn.join(group, member_a, version=5, instance_id="static-a",
                         topics=(topic_name,))
    thread.join(15)
    assert rejoined.error_code == NONE and out and out[0].error_code == NONE, (rejoined, out)
    member_b = out[0].member_id
    gen = rejoined.generation_id
    assert conn.sync(group, gen, member_a, {member_a: assignment(topic_name, [0]),
                                           member_b: assignment(topic_name, [1])},
                     instance_id="static-a").error_code == NONE
    # One request: the static member by instance id alone, the dynamic one by member id,
    # and a stranger.
    left = conn.leave(group, [("", "static-a"), (member_b, None), ("stranger", None)],
                      version=4)
    assert left.error_code == NONE, left
    assert [(m.member_id, m.group_instance_id, m.error_code) for m in left.members] == [
        ("", "static-a", NONE), (member_b, None, NONE), ("stranger", None, UNKNOWN_MEMBER_ID)]
    assert conn.heartbeat(group, gen, member_a, instance_id="static-a") == UNKNOWN_MEMBER_ID
    assert conn.heartbeat(group, gen, member_b) == UNKNOWN_MEMBER_ID
    wrong = conn.leave(group, [("not-a", "static-z")], version=3)
    assert [m.error_code for m in wrong.members] == [UNKNOWN_MEMBER_ID]


def test_join_with_no_common_protocol(conn: GroupConnection, topic_name: str) -> None:
    group = group_id_for(topic_name)
    member, generation = stable_member(conn, group, topic_name)
    for version in (3, 5):
        other = conn.join_new(group, version=version, topics=(topic_name,),
                              protocols=("roundrobin",))
        assert other.error_code == INCONSISTENT_GROUP_PROTOCOL, other
    assert conn.heartbeat(group, generation, member) == NONE  # the group is undisturbed


def test_commit_for_a_missing_topic_or_partition(gbroker: BrokerProcess, conn: GroupConnection,
                                                 topic_name: str) -> None:
    create_topic(gbroker.bootstrap, topic_name, 2)
    group = group_id_for(topic_name)
    assert conn.commit(group, -1, "", topic_name, {0: (1, None), 5: (1, None)}) == \
        {0: NONE, 5: UNKNOWN_TOPIC_OR_PARTITION}
    assert conn.commit(group, -1, "", topic_name + "-missing", {0: (1, None)}) == \
        {0: UNKNOWN_TOPIC_OR_PARTITION}
    assert conn.fetch_offsets(group, topic_name, [0, 1])[1] == {
        0: (1, "", NONE), 1: (-1, "", NONE)}


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``call`` in a thread (a request that blocks); its answer lands in the list."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as exc:  # surfaced by the test through ``out``
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def two_members_joined(gbroker: BrokerProcess, conn: GroupConnection, group: str,
                       topic: str, follower_session_ms: int, rebalance_ms: int,
                       instances: tuple[str, str] | None = None) -> tuple[str, str, int]:
    """A leader alone (long session), then a follower joins and the leader rejoins: the
    join phase of a two-member generation is over. (leader, follower, generation).
    With ``instances``, both are static members with these instance ids."""
    lead_instance, follow_instance = instances or (None, None)
    leader, gen1 = stable_member(conn, group, topic, session_ms=MAX_SESSION_MS,
                                 rebalance_ms=rebalance_ms, instance_id=lead_instance)
    thread, out = join_in_thread(gbroker.port, group, version=3 if instances is None else 5,
                                 topics=(topic,), session_ms=follower_session_ms,
                                 rebalance_ms=rebalance_ms, instance_id=follow_instance)
    deadline = time.monotonic() + 15
    while conn.heartbeat(group, gen1, leader, instance_id=lead_instance) == NONE and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    rejoined = conn.join(group, leader, topics=(topic,), session_ms=MAX_SESSION_MS,
                         rebalance_ms=rebalance_ms, instance_id=lead_instance)
    thread.join(20)
    assert rejoined.error_code == NONE and rejoined.leader == leader, rejoined
    assert len(out) == 1 and not isinstance(out[0], Exception), out
    assert out[0].error_code == NONE and out[0].generation_id == gen1 + 1, out[0]
    return leader, out[0].member_id, rejoined.generation_id


def test_a_follower_waiting_for_its_assignment_outlives_its_session(
        gbroker: BrokerProcess, conn: GroupConnection, topic_name: str) -> None:
    # As Kafka (members awaiting sync satisfy their heartbeat; librdkafka sends none while
    # its SyncGroup waits): a slow leader does not get its followers expelled.
    create_topic(gbroker.bootstrap, topic_name, 2)
    group = group_id_for(topic_name)
    leader, follower, gen = two_members_joined(gbroker, conn, group, topic_name,
                                               MIN_SESSION_MS, MAX_SESSION_MS)
    other = GroupConnection(gbroker.port, timeout=60)
    try:
        thread, out = in_thread(lambda: other.sync(group, gen, follower))
        # the leader heartbeats (its group is fine) for three of the follower's sessions
        until = time.monotonic() + 3 * MIN_SESSION_MS / 1000
        while time.monotonic() < until and not out:
            assert conn.heartbeat(group, gen, leader) == NONE
            time.sleep(0.1)
        assert not out, out  # still waiting for the assignment, not expelled
        plan = {leader: assignment(topic_name, [0]), follower: assignment(topic_name, [1])}
        assert conn.sync(group, gen, leader, plan).error_code == NONE
        thread.join(30)
        assert len(out) == 1 and not isinstance(out[0], Exception), out
        assert out[0].error_code == NONE, out[0]
        assert bytes(out[0].assignment) == plan[follower]
        assert other.heartbeat(group, gen, follower) == NONE
    finally:
        other.close()


def test_a_leader_that_never_syncs_is_removed_after_the_rebalance_timeout(
        gbroker: BrokerProcess, conn: GroupConnection, topic_name: str) -> None:
    # As Kafka's pending-sync expiration: the members that did not send SyncGroup within
    # the rebalance timeout are removed and the group rebalances without them.
    create_topic(gbroker.bootstrap, topic_name, 2)
    group = group_id_for(topic_name)
    leader, follower, gen = two_members_joined(gbroker, conn, group, topic_name,
                                               MAX_SESSION_MS, 2 * MIN_SESSION_MS)
    other = GroupConnection(gbroker.port, timeout=60)
    try:
        thread, out = in_thread(lambda: other.sync(group, gen, follower))
        thread.join(45)  # the leader neither syncs nor heartbeats; its session is 60 s
        assert len(out) == 1 and not isinstance(out[0], Exception), out
        assert out[0].error_code == REBALANCE_IN_PROGRESS, out[0]
        again = other.join(group, follower, version=3, topics=(topic_name,),
                           session_ms=MAX_SESSION_MS, rebalance_ms=2 * MIN_SESSION_MS)
        assert again.error_code == NONE, again
        assert again.generation_id == gen + 1 and again.leader == follower
        assert [m.member_id for m in again.members] == [follower]
        assert conn.heartbeat(group, gen, leader) == UNKNOWN_MEMBER_ID
    finally:
        other.close()


def test_static_members_that_did_not_rejoin_stay_in_the_next_generation(
        gbroker: BrokerProcess, conn: GroupConnection, topic_name: str) -> None:
    # As Kafka: the rebalance timeout removes only dynamic members that did not rejoin; a
    # static member (restarting, silent) stays until its session ends.
    create_topic(gbroker.bootstrap, topic_name, 2)
    group = group_id_for(topic_name)
    rebalance_ms = 2 * MIN_SESSION_MS
    leader, follower, gen = two_members_joined(gbroker, conn, group, topic_name,
                                               MAX_SESSION_MS, rebalance_ms, ("i-a", "i-b"))
    other = GroupConnection(gbroker.port, timeout=30)
    try:
        thread, out = in_thread(lambda: other.sync(group, gen, follower, instance_id="i-b"))
        plan = {leader: assignment(topic_name, [0]), follower: assignment(topic_name, [1])}
        assert conn.sync(group, gen, leader, plan, instance_id="i-a").error_code == NONE
        thread.join(30)
        assert len(out) == 1 and out[0].error_code == NONE, out
    finally:
        other.close()
    # the static follower goes silent (restarting); a dynamic member arrives
    newcomer, joined = join_in_thread(gbroker.port, group, version=3, topics=(topic_name,),
                                      session_ms=MAX_SESSION_MS, rebalance_ms=rebalance_ms)
    wait_until_rebalancing = time.monotonic() + 15
    while conn.heartbeat(group, gen, leader, instance_id="i-a") == NONE and \
            time.monotonic() < wait_until_rebalancing:
        time.sleep(0.05)
    rejoined = conn.join(group, leader, topics=(topic_name,), instance_id="i-a",
                         session_ms=MAX_SESSION_MS, rebalance_ms=rebalance_ms)
    newcomer.join(30)
    assert rejoined.error_code == NONE and rejoined.generation_id == gen + 1, rejoined
    assert len(joined) == 1 and joined[0].error_code == NONE, joined
    members = {m.member_id: m.group_instance_id for m in rejoined.members}
    assert members == {leader: "i-a", follower: "i-b", joined[0].member_id: None}
    # the static member comes back with its member id: it is in the generation
    back = GroupConnection(gbroker.port, timeout=30)
    try:
        assert back.heartbeat(group, gen + 1, follower, instance_id="i-b") == NONE
    finally:
        back.close()
