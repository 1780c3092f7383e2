"""An OffsetCommit whose write to ``__consumer_offsets`` is committed in PostgreSQL while
its answer is lost (the broker's connection drops after the statement ran), as clients see
it: a broker on PostgreSQL through a proxy that can lose the database's answers
(``tests/pg_proxy.py``), kafka-python and confluent-kafka reading the committed offset."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import confluent_kafka
import kafka

from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.coordinator_failures import stored_end
from tests.group_helpers import (
    COORDINATOR_LOAD_IN_PROGRESS,
    NONE,
    NOT_COORDINATOR,
    GroupConnection,
)
from tests.pg_proxy import PgProxy
from tests.postgres_server import shared_server

OFFSETS_TOPIC = "public/__kafka/__consumer_offsets"


def test_clients_read_the_stored_offset_after_a_commit_whose_answer_was_lost(
        tmp_path: Path, topic_name: str) -> None:
    """Offset 5 is committed; the commit of offset 10 is stored, but its answer never
    reaches the broker, which answers it NOT_COORDINATOR. Until the broker has read the
    group's partition again its OffsetFetch is answered COORDINATOR_LOAD_IN_PROGRESS (the
    clients retry), never offset 5, and a heartbeat NONE (as Kafka answers one then); then
    kafka-python and confluent-kafka read offset 10, what a restart would show, with no
    restart."""
    url = shared_server().new_database_url()
    group = f"lost-{topic_name}"
    with PgProxy(url) as proxy:
        broker = BrokerProcess(tmp_path, {"storageUrl": proxy.url,
                                          "offsetsTopicNumPartitions": "1"}).start()
        conn = GroupConnection(broker.port)
        try:
            create_topic(broker.bootstrap, topic_name, 1)
            partition = kafka.TopicPartition(topic_name, 0)
            consumer = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap,
                                           group_id=group, enable_auto_commit=False)
            consumer.commit({partition: kafka.OffsetAndMetadata(5, "", -1)})
            assert consumer.committed(partition) == 5

            before = stored_end(url, OFFSETS_TOPIC)
            proxy.hold()
            answers: list[dict[int, int]] = []
            committing = threading.Thread(target=lambda: answers.append(
                conn.commit(group, -1, "", topic_name, {0: (10, "")})))
            committing.start()
            deadline = time.monotonic() + 30
            while stored_end(url, OFFSETS_TOPIC) == before:
                assert time.monotonic() < deadline, "the commit was never stored"
                time.sleep(0.01)
            cut = 0  # its answer lost: cut once it reaches the proxy (a moment later)
            while committing.is_alive() and time.monotonic() < deadline:
                cut += proxy.cut()
                committing.join(0.01)
            assert cut > 0 and not committing.is_alive()
            assert answers == [{0: NOT_COORDINATOR}]
            # the database's answers are still held: the broker cannot read the log yet
            fetch = GroupConnection(broker.port)
            try:
                error, _ = fetch.fetch_offsets(group, topic_name, [0])
                # a member's heartbeat is answered blindly meanwhile, as Kafka does (the
                # group, once read, tells it whether to rejoin)
                beat = fetch.heartbeat(group, 1, "a-member")
            finally:
                fetch.close()
            assert error == COORDINATOR_LOAD_IN_PROGRESS
            assert beat == NONE
            proxy.cut()
            proxy.release()

            assert consumer.committed(partition) == 10  # retried until read again
            consumer.close()
            assert _confluent_committed(broker.bootstrap, group, topic_name) == 10
            broker.wait_for_log(r"__consumer_offsets-0: a write.s outcome is unknown")
        finally:
            conn.close()
            broker.kill()


def _confluent_committed(bootstrap: str, group: str, topic: str) -> int:
    consumer: Any = confluent_kafka.Consumer({"bootstrap.servers": bootstrap,
                                              "group.id": group})
    try:
        found = consumer.committed([confluent_kafka.TopicPartition(topic, 0)], timeout=30)
        assert found[0].error is None, found[0].error
        return int(found[0].offset)
    finally:
        consumer.close()
