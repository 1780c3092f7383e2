"""Fetch requests Kafka answers by their shape, sent exactly: a request naming a fetch
session (KIP-227; the broker hands none out) and a partition named twice."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kafka.protocol.consumer import FetchRequest, FetchResponse

from tests.broker_process import BrokerProcess
from tests.protocol.test_bad_input import create, produce
from tests.protocol.test_fetch import offsets_in
from tests.raw import RawConnection, record_batch

FETCH_SESSION_ID_NOT_FOUND = 70

Wanted = list[tuple[str, list[tuple[int, int]]]]
"""The request's topics in order, each with (partition, fetch offset) in order."""


def fetch(conn: RawConnection, wanted: Wanted, *, version: int = 12, session_id: int = 0,
          session_epoch: int = -1, forgotten: Wanted | None = None) -> Any:
    """A Fetch of ``wanted`` with a session id and epoch; the decoded response."""
    topics = [FetchRequest.FetchTopic(topic=topic, partitions=[
        FetchRequest.FetchTopic.FetchPartition(
            partition=partition, current_leader_epoch=-1, fetch_offset=offset,
            last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)
        for partition, offset in parts]) for topic, parts in wanted]
    request = FetchRequest[version](
        replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
        session_id=session_id, session_epoch=session_epoch, topics=topics,
        forgotten_topics_data=[FetchRequest.ForgottenTopic(
            topic=topic, partitions=[partition for partition, _ in parts])
            for topic, parts in forgotten or []], rack_id="")
    return conn.call(request, version, FetchResponse)


def answered(response: Any) -> list[tuple[str, list[tuple[int, int, list[int]]]]]:
    """Each topic answered, with (partition, error, offsets of the records) in order."""
    return [(topic.topic, [(part.partition_index, part.error_code, offsets_in(part.records))
                           for part in topic.partitions])
            for topic in response.responses]


@pytest.fixture(scope="module")
def conn(broker: BrokerProcess) -> Iterator[RawConnection]:
    """A connection to the module's broker."""
    opened = RawConnection(broker.port)
    yield opened
    opened.close()


@pytest.fixture
def topic(conn: RawConnection, topic_name: str) -> str:
    """A topic of two partitions, each holding offsets 0 to 9 in two batches of five."""
    assert create(conn, topic_name, 2) == 0
    for partition in (0, 1):
        for _ in range(2):
            assert produce(conn, topic_name, record_batch(5),
                           partition=partition).error_code == 0
    return topic_name


@pytest.mark.parametrize("version", [7, 12])
@pytest.mark.parametrize(("session_id", "epoch"), [(1234, 5), (1234, 1), (0, 3), (7, -2)])
def test_a_request_naming_a_session_is_answered_session_id_not_found(
        conn: RawConnection, topic: str, version: int, session_id: int, epoch: int) -> None:
    """An epoch neither 0 nor -1 names a session: no session exists (none is handed out),
    so Kafka's FetchManager answers FETCH_SESSION_ID_NOT_FOUND, whatever the id (0 too),
    with no partitions, and reads nothing."""
    for wanted in ([(topic, [(0, 0)])], []):  # an incremental fetch may name none
        response = fetch(conn, wanted, version=version, session_id=session_id,
                         session_epoch=epoch)
        assert (response.error_code, response.session_id, response.responses) == \
            (FETCH_SESSION_ID_NOT_FOUND, 0, [])


@pytest.mark.parametrize(("session_id", "epoch"), [(0, -1), (0, 0), (1234, 0), (1234, -1)])
def test_a_full_fetch_is_answered_without_a_session(
        conn: RawConnection, topic: str, session_id: int, epoch: int) -> None:
    """Epoch 0 (a new session) or -1 (none): a full fetch, answered in full with session
    id 0 (Kafka with no room for sessions; a session id given is closed, so ignored), the
    forgotten topics of a full fetch ignored."""
    response = fetch(conn, [(topic, [(0, 0), (1, 5)])], session_id=session_id,
                     session_epoch=epoch, forgotten=[(topic, [(0, 0)])])
    assert (response.error_code, response.session_id) == (0, 0)
    assert answered(response) == [(topic, [(0, 0, list(range(10))), (1, 0, [5, 6, 7, 8, 9])])]


def test_a_partition_named_twice_is_answered_once(conn: RawConnection, topic: str) -> None:
    """Kafka keys a fetch's partitions in a LinkedHashMap: a partition named again keeps
    the place it was first named at and takes the later entry's fetch offset."""
    response = fetch(conn, [(topic, [(0, 0), (1, 0), (0, 5)])])
    assert answered(response) == [(topic, [(0, 0, [5, 6, 7, 8, 9]), (1, 0, list(range(10)))])]
    response = fetch(conn, [(topic, [(1, 5)]), ("elsewhere", [(0, 0)]), (topic, [(1, 0)])])
    assert [(name, [p for p, _, _ in parts]) for name, parts in answered(response)] == \
        [(topic, [1]), ("elsewhere", [0])]
    assert answered(response)[0][1][0][2] == list(range(10))
