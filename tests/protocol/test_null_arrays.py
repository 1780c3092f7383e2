"""A null in a request's top-level array field, for every served API and version
(``tests/fuzz_requests.py`` builds the requests from kafka-python's schemas).

Where the schema lets the array be null the broker answers (with error codes or a normal
answer); where it does not, the frame is garbage as Kafka's readers see it: the connection
is closed with one log line naming the field, no traceback, and the broker stays up."""

from __future__ import annotations

import re
import struct
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceRequest

from tests.broker_process import BrokerProcess
from tests.clients import PARTITIONS
from tests.fuzz_requests import TOPIC, null_array_cases
from tests.raw import RawConnection


def test_null_top_level_arrays_are_answered_or_refused(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", {"groupInitialRebalanceDelayMs": "0"}).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(10)
        problems: list[str] = []
        refused = answered = 0
        first_refusals: dict[tuple[str, str], int] = {}
        for case, field, nullable in null_array_cases():
            what = f"{case.api} v{case.version} with {field} null"
            conn = RawConnection(broker.port, timeout=5.0)
            try:
                conn.send_frame(conn.request_bytes(case.request, case.version))
                frame = conn.read_frame()
            except TimeoutError:
                problems.append(f"neither answered nor closed: {what}")
                continue
            except OSError:
                if nullable:
                    problems.append(f"closed on a null the schema allows: {what}")
                    continue
                first_refusals.setdefault((case.api, field), case.version)
                refused += 1
                continue
            finally:
                conn.close()
            if not nullable:
                problems.append(f"answered a null the schema forbids: {what}")
            elif struct.unpack_from(">i", frame, 0)[0] != conn.correlation_id:
                problems.append(f"wrong correlation id: {what}")
            answered += 1
        assert problems == [], "\n".join(problems)[:4000]
        assert refused > 100 and answered > 20
        for (api, field), version in first_refusals.items():  # later ones are rate-limited
            broker.wait_for_log(re.escape(f"malformed {api} v{version} request: "
                                          f"non-nullable field {field} is null"))
        log = broker.log_text()
        assert "Traceback" not in log and "failed; closing" not in log, log[-4000:]
        closes = [line for line in log.splitlines() if "closing connection" in line]
        assert len(closes) <= refused, "\n".join(closes)[-4000:]
        assert all("non-nullable field" in line for line in closes), "\n".join(closes)[-4000:]
        assert broker.alive()
    finally:
        broker.stop()


def test_nested_nulls_the_schema_forbids_close_the_connection(tmp_path: Path) -> None:
    """Deeper down too: a null partition array of a Fetch topic, a null topic name of a
    Produce; the broker then answers a good request on a new connection."""
    fetch = FetchRequest[4](replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
                            isolation_level=0,
                            topics=[FetchRequest[4].FetchTopic(topic=TOPIC, partitions=None)])
    produce = ProduceRequest[9](transactional_id=None, acks=1, timeout_ms=1000, topic_data=[
        ProduceRequest[9].TopicProduceData(name=None, partition_data=[])])
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        for request, version, reason in ((fetch, 4, "Fetch v4 request: non-nullable field "
                                                    "topics.partitions is null"),
                                         (produce, 9, "Produce v9 request: non-nullable field "
                                                      "topic_data.name is null")):
            conn = RawConnection(broker.port)
            try:
                conn.send_frame(conn.request_bytes(request, version))
                assert conn.closed_by_peer()
            finally:
                conn.close()
            broker.wait_for_log(re.escape(reason))
        conn = RawConnection(broker.port)
        try:
            answer = conn.call(MetadataRequest[1](topics=None), 1, MetadataResponse)
            assert [b.node_id for b in answer.brokers] == [0]
        finally:
            conn.close()
        assert "Traceback" not in broker.log_text()
    finally:
        broker.stop()
