"""Creating thousands of partitions does not stall the broker: while one CreateTopics
request makes 5,000 partitions, another connection's requests keep being answered, and
every topic it created is there after a restart (the files are made durable together)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient
from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from tests.broker_process import BrokerProcess
from tests.raw import RawConnection

TOPICS = 500
PARTITIONS = 10
ANSWERED_AT_LEAST = 10
"""ApiVersions answered to another connection while the creation ran. With the files made
on the event loop none was (the loop was busy for the whole request); off it, hundreds."""


def _create_request() -> CreateTopicsRequest:
    topics = [CreateTopicsRequest.CreatableTopic(
        name=f"many-{i:04d}", num_partitions=PARTITIONS, replication_factor=1,
        assignments=[], configs=[]) for i in range(TOPICS)]
    return CreateTopicsRequest[4](topics=topics, timeout_ms=300_000, validate_only=False)


def test_other_connections_are_answered_while_thousands_of_partitions_are_created(
        tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path).start()
    try:
        creator = RawConnection(broker.port, timeout=300)
        other = RawConnection(broker.port, timeout=60)
        other.call(ApiVersionsRequest[0](), 0, ApiVersionsResponse)  # connected and served
        answers: list[float] = []
        stop = threading.Event()

        def ask() -> None:
            while not stop.is_set():
                other.call(ApiVersionsRequest[0](), 0, ApiVersionsResponse)
                answers.append(time.monotonic())

        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        sent = time.monotonic()
        response = creator.call(_create_request(), 4, CreateTopicsResponse)
        answered = time.monotonic()
        stop.set()
        asker.join(60)
        assert not asker.is_alive(), "the Metadata asker did not stop"
        assert {t.error_code for t in response.topics} == {0}
        during = sum(1 for at in answers if sent < at < answered)
        assert during >= ANSWERED_AT_LEAST, (
            f"{during} requests answered during the {answered - sent:.1f} s creation")
        creator.close()
        other.close()
        assert broker.stop() == 0

        broker.start(timeout=120)
        listed = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=60)
        many = {name: len(t.partitions) for name, t in listed.topics.items()
                if name.startswith("many-")}
        assert len(many) == TOPICS
        assert set(many.values()) == {PARTITIONS}
    finally:
        broker.stop()
