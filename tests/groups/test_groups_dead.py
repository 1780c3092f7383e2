"""A group is Dead while DeleteGroups' tombstones are being written (PostgreSQL engine: the
``__consumer_offsets`` rows held locked by the test, so the write waits): a LeaveGroup
meanwhile is answered COORDINATOR_NOT_AVAILABLE for the whole request, as Kafka's
GroupCoordinator.handleLeaveGroup (the client retries), not UNKNOWN_MEMBER_ID per member;
once the write is done the group is gone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from kafka.protocol.admin import DeleteGroupsRequest, DeleteGroupsResponse

from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.group_helpers import NONE, UNKNOWN_MEMBER_ID, GroupConnection, group_id_for
from tests.postgres_server import shared_server
from tests.storage.test_postgres_speed import _lock_waits
from tests.txn_helpers import wait_until

COORDINATOR_NOT_AVAILABLE = 15


@pytest.fixture(scope="module")
def pg_url() -> str:
    return shared_server().new_database_url()


@pytest.fixture(scope="module")
def pg_broker(tmp_path_factory: pytest.TempPathFactory, pg_url: str) -> Iterator[BrokerProcess]:
    data = Path(tmp_path_factory.mktemp("dead-group")) / "data"
    process = BrokerProcess(data, {"storageUrl": pg_url}).start()
    yield process
    process.stop()


def test_leave_group_while_the_group_is_deleted(pg_broker: BrokerProcess, pg_url: str,
                                                topic_name: str) -> None:
    group = group_id_for(topic_name)
    create_topic(pg_broker.bootstrap, topic_name, 1)
    conn = GroupConnection(pg_broker.port, timeout=30)
    deleter = GroupConnection(pg_broker.port, timeout=30)
    try:
        # a group that only stores offsets: Empty, so DeleteGroups may delete it (committed
        # once the coordinator has loaded its partition)
        wait_until(lambda: conn.commit(group, -1, "", topic_name, {0: (5, None)}) == {0: NONE},
                   30, "the offsets committed")
        with psycopg.connect(pg_url) as locker:
            locker.execute("SELECT 1 FROM edge_partitions WHERE topic LIKE %s FOR UPDATE",
                           ("%__consumer_offsets",))
            deleter.send_frame(deleter.request_bytes(DeleteGroupsRequest[2](groups_names=[group]),
                                                     2))
            wait_until(lambda: bool(_lock_waits(pg_url)), 30, "the tombstones' commit waiting")
            answer = conn.leave(group, [("m-1", None), ("", "i-1")], version=3)
            assert (answer.error_code, answer.members) == (COORDINATOR_NOT_AVAILABLE, [])
            assert conn.leave(group, [("m-1", None)], version=2).error_code == \
                COORDINATOR_NOT_AVAILABLE
            locker.rollback()
        deleted = DeleteGroupsResponse.decode(deleter.read_frame()[5:], version=2)
        assert [(r.group_id, r.error_code) for r in deleted.results] == [(group, NONE)]
        # gone: a LeaveGroup now names members it does not know
        answer = conn.leave(group, [("m-1", None)], version=3)
        assert answer.error_code == NONE
        assert [m.error_code for m in answer.members] == [UNKNOWN_MEMBER_ID]
    finally:
        conn.close()
        deleter.close()
