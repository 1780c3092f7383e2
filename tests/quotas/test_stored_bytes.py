"""``max_stored_bytes`` counts a produced batch as the topic stores it, not as it came: a
small gzip batch into a topic whose compression.type is ``uncompressed`` stores many
times its size and is refused when that would take the tenant beyond its cap; and the
batches of one Produce request each count against what the ones before them added (not
all against the usage before the request). Raw Produce frames against a real broker."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from tests.broker_process import BrokerProcess
from tests.raw import record_batch
from tests.security_helpers import OpsConnection

CAP = 1 << 20
KAFKA_STORAGE_ERROR = 56
GZIP = 1


@pytest.fixture()
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    # the periodic sum of the partitions' sizes is kept out of the way: between two sums
    # the broker counts what it stores, which is what is tested here
    process = BrokerProcess(tmp_path / "data", {
        "defaultTenantMaxStoredBytes": str(CAP),
        "tenantUsageCheckIntervalMs": "3600000"}).start()
    try:
        yield process
    finally:
        process.stop(30)


def _gzip_batch(size: int) -> bytes:
    """One record of ``size`` zero bytes, gzip-compressed (a few kB on the wire)."""
    builder = DefaultRecordBatchBuilder(2, GZIP, False, -1, -1, -1, 1 << 30)
    builder.append(0, int(time.time() * 1000), b"k", b"\0" * size, [])
    return bytes(builder.build())


def _produce(conn: OpsConnection, topic: str, batches: list[bytes]) -> list[int]:
    """One Produce request with ``batches[i]`` for partition i; the error codes."""
    data = ProduceRequest.TopicProduceData
    request = ProduceRequest[9](transactional_id=None, acks=1, timeout_ms=30000, topic_data=[
        data(name=topic, partition_data=[data.PartitionProduceData(index=i, records=batch)
                                         for i, batch in enumerate(batches)])])
    answer = conn.call(request, 9, ProduceResponse)
    return [int(p.error_code) for p in answer.responses[0].partition_responses]


def test_a_batch_counts_as_stored_and_a_request_counts_its_batches_in_turn(
        broker: BrokerProcess) -> None:
    conn = OpsConnection(broker.port, timeout=60)
    assert conn.create_topic("bomb", 2) == 0
    assert conn.alter_config("bomb", "compression.type", "uncompressed") == 0
    assert conn.alter_config("bomb", "max.message.bytes", str(1 << 30)) == 0
    bomb = _gzip_batch(2 * CAP)
    assert len(bomb) < CAP // 100
    codes = _produce(conn, "bomb", [bomb, bomb])
    print(f"two {len(bomb)}-byte gzip batches that store {2 * CAP} bytes each, tenant "
          f"capped at {CAP}: {codes}")
    assert codes == [KAFKA_STORAGE_ERROR, KAFKA_STORAGE_ERROR]
    assert conn.list_offset("bomb", 0) == (0, 0)  # nothing stored

    assert conn.create_topic("plain", 4) == 0
    batch = record_batch(1, value=b"x" * 300_000)  # 3 fit under the cap, 4 do not
    codes = _produce(conn, "plain", [batch] * 4)
    print(f"one request of four {len(batch)}-byte batches, cap {CAP}: {codes}")
    assert codes == [0, 0, 0, KAFKA_STORAGE_ERROR]
    assert conn.produce("plain", 1, 0, value=b"x" * 100) == 0  # room left for a small one
