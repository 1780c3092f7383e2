"""A group's bounds on a real broker, over raw requests: ``groupMetadataMaxBytes`` (a
JoinGroup or a leader's assignment that would take the group's record over it is refused
UNKNOWN_SERVER_ERROR, as Kafka answers a group record its offsets topic cannot store),
``groupMaxSize`` (members and pending member ids: GROUP_MAX_SIZE_REACHED beyond), and a
group made only by refused or lapsed joins is forgotten instead of lingering until the
next expiry pass. The broker stays up and answers the others meanwhile."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.protocol.admin import ListGroupsRequest, ListGroupsResponse

from tests.broker_process import BrokerProcess
from tests.group_helpers import (
    INCONSISTENT_GROUP_PROTOCOL,
    MEMBER_ID_REQUIRED,
    NONE,
    REBALANCE_IN_PROGRESS,
    GroupConnection,
    group_id_for,
    start_broker,
    wait_until,
)

UNKNOWN_SERVER_ERROR = -1
GROUP_MAX_SIZE_REACHED = 81
MAX_BYTES = 64 * 1024
MAX_SIZE = 3
SESSION_MS = 1000


@pytest.fixture(scope="module")
def bbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker with small group bounds and no initial rebalance delay."""
    process = start_broker(Path(tmp_path_factory.mktemp("groups-bounds")),
                           groupInitialRebalanceDelayMs="0",
                           groupMetadataMaxBytes=str(MAX_BYTES),
                           groupMaxSize=str(MAX_SIZE))
    yield process
    process.stop()


@pytest.fixture
def conn(bbroker: BrokerProcess) -> Iterator[GroupConnection]:
    connection = GroupConnection(bbroker.port, timeout=20)
    yield connection
    connection.close()


def listed(conn: GroupConnection) -> set[str]:
    answer = conn.call(ListGroupsRequest[3](), 3, ListGroupsResponse)
    assert answer.error_code == NONE
    return {g.group_id for g in answer.groups}


def test_a_join_over_the_metadata_bound_is_refused(bbroker: BrokerProcess,
                                                   conn: GroupConnection,
                                                   topic_name: str) -> None:
    group = group_id_for(topic_name)
    big = b"x" * (MAX_BYTES + 1)
    for version in (3, 5):  # a new member at once, and the MEMBER_ID_REQUIRED step
        refused = conn.join(group, version=version, metadata=big)
        assert refused.error_code == UNKNOWN_SERVER_ERROR, (version, refused)
    assert group not in listed(conn)  # nothing of it kept
    half = b"y" * (MAX_BYTES // 2 + 1)
    joined = conn.join_new(group, metadata=half)
    assert joined.error_code == NONE, joined
    # a second member that would take the group over the bound
    other = GroupConnection(bbroker.port, timeout=20)
    try:
        assert other.join(group, version=3, metadata=half).error_code == \
            UNKNOWN_SERVER_ERROR
    finally:
        other.close()
    assert bbroker.alive()
    log = bbroker.log_text()
    assert "groupMetadataMaxBytes" in log and "x" * 100 not in log


def test_a_leader_assignment_over_the_metadata_bound_is_refused(
        bbroker: BrokerProcess, conn: GroupConnection, topic_name: str) -> None:
    group = group_id_for(topic_name)
    joined = conn.join_new(group)
    assert joined.error_code == NONE and joined.leader == joined.member_id
    member, generation = joined.member_id, joined.generation_id
    synced = conn.sync(group, generation, member, {member: b"a" * (MAX_BYTES + 1)})
    assert synced.error_code == UNKNOWN_SERVER_ERROR, synced
    # as Kafka after a failed store of the assignment: the group rebalances
    assert conn.heartbeat(group, generation, member) == REBALANCE_IN_PROGRESS
    again = conn.join(group, member)
    assert again.error_code == NONE, again
    synced = conn.sync(group, again.generation_id, member, {member: b"fits"})
    assert synced.error_code == NONE and synced.assignment == b"fits"


def test_group_max_size_counts_pending_member_ids(conn: GroupConnection,
                                                  topic_name: str) -> None:
    group = group_id_for(topic_name)
    pending = []
    for _ in range(MAX_SIZE):
        first = conn.join(group, session_ms=SESSION_MS)
        assert first.error_code == MEMBER_ID_REQUIRED, first
        pending.append(first.member_id)
    full = conn.join(group, session_ms=SESSION_MS)
    assert (full.error_code, full.member_id) == (GROUP_MAX_SIZE_REACHED, "")
    assert conn.join(group, version=3).error_code == GROUP_MAX_SIZE_REACHED
    # a pending id joining with it adds nobody: accepted (answered once the other
    # pending ids lapsed)
    joined = conn.join(group, pending[0], session_ms=SESSION_MS)
    assert joined.error_code == NONE, joined
    # room again: the lapsed ids are gone
    assert conn.join(group, session_ms=SESSION_MS).error_code == MEMBER_ID_REQUIRED


def test_a_group_of_refused_or_lapsed_joins_is_forgotten(conn: GroupConnection,
                                                         topic_name: str) -> None:
    refused = group_id_for(topic_name, "refused")
    answer = conn.join(refused, protocols=())
    assert answer.error_code == INCONSISTENT_GROUP_PROTOCOL, answer
    assert refused not in listed(conn)  # at once
    lapsed = group_id_for(topic_name, "lapsed")
    assert conn.join(lapsed, session_ms=SESSION_MS).error_code == MEMBER_ID_REQUIRED
    assert lapsed in listed(conn)
    wait_until(lambda: lapsed not in listed(conn), 20, "the lapsed group to be forgotten")
    left = group_id_for(topic_name, "left")
    first = conn.join(left, session_ms=60_000)
    assert first.error_code == MEMBER_ID_REQUIRED
    assert [m.error_code for m in conn.leave(left, [(first.member_id, None)]).members] == \
        [NONE]
    assert left not in listed(conn)
