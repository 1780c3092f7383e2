"""Metadata auto-creation counts against a tenant's ``max_partitions`` as CreateTopics
does, also while a CreateTopics is still creating its partitions in a worker thread: on
one broker both take the engine's topic lock, so the cap holds whatever the
interleaving. Raw frames against a real broker (file engine)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from tests.broker_process import BrokerProcess
from tests.raw import RawConnection

CAP = 2000
PER_TOPIC = 10


@pytest.fixture()
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path / "data", {
        "defaultTenantMaxPartitions": str(CAP),
        "defaultNumPartitions": str(PER_TOPIC)}).start()
    try:
        yield process
    finally:
        process.stop(60)


def _metadata(conn: RawConnection, names: list[str] | None, create: bool) -> MetadataResponse:
    topics = None if names is None else [
        MetadataRequest.MetadataRequestTopic(name=name, topic_id=None) for name in names]
    return conn.call(MetadataRequest[12](topics=topics, allow_auto_topic_creation=create,
                                         include_topic_authorized_operations=False),
                     12, MetadataResponse)


def test_auto_creation_while_a_creation_is_under_way_keeps_the_partition_cap(
        broker: BrokerProcess) -> None:
    answered: list[tuple[int, str | None]] = []
    sent = threading.Event()

    def create_big() -> None:
        conn = RawConnection(broker.port, timeout=300)
        topic = CreateTopicsRequest.CreatableTopic(
            name="big", num_partitions=CAP, replication_factor=1, assignments=[], configs=[])
        conn.send_frame(conn.request_bytes(CreateTopicsRequest[5](
            topics=[topic], timeout_ms=300_000, validate_only=False), 5))
        sent.set()
        answer = CreateTopicsResponse.decode(conn.read_frame()[5:], version=5)  # header v1
        answered.append((int(answer.topics[0].error_code), answer.topics[0].error_message))

    creating = threading.Thread(target=create_big)
    creating.start()
    assert sent.wait(30)
    conn = RawConnection(broker.port, timeout=300)
    rounds = auto_created = 0
    while not answered and rounds < 50:  # asked while the creation is under way
        answer = _metadata(conn, [f"auto{rounds}-{i}" for i in range(5)], True)
        auto_created += sum(1 for topic in answer.topics if topic.error_code == 0)
        rounds += 1
    creating.join(300)
    assert not creating.is_alive(), "the CreateTopics request was not answered"
    partitions = sum(len(topic.partitions) for topic in _metadata(conn, None, False).topics)
    print(f"CreateTopics of {CAP} partitions: {answered}; {rounds} Metadata rounds meanwhile "
          f"auto-created {auto_created} topics; {partitions} partitions, cap {CAP}")
    assert partitions <= CAP
    assert answered[0][0] == 0 or auto_created > 0  # one of them had the room
