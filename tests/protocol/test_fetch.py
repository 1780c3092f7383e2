"""Fetch semantics with exact requests: long polls woken by appends, ``max_bytes`` and
partition limits (the first batch always comes whole), and the advertised API table."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.record import MemoryRecords

from tests.broker_process import BrokerProcess
from tests.protocol.test_bad_input import create, produce
from tests.raw import RawConnection, record_batch

pytestmark = pytest.mark.storage_engines  # each test on file://, memory:// and postgres://

IMPLEMENTED = {0: (3, 11), 1: (4, 12), 2: (1, 10), 3: (0, 12), 8: (2, 9), 9: (1, 9), 10: (0, 4),
               11: (0, 9), 12: (0, 4), 13: (0, 5), 14: (0, 5), 15: (0, 5), 16: (0, 5),
               17: (0, 1), 18: (0, 4), 19: (2, 7), 20: (1, 6), 21: (0, 2), 22: (0, 5),
               23: (2, 4), 24: (0, 5), 25: (0, 4), 26: (0, 4), 27: (1, 1), 28: (0, 4),
               29: (1, 3), 30: (1, 3), 31: (1, 3), 32: (1, 4), 33: (0, 2), 34: (0, 2),
               35: (0, 4), 36: (0, 2), 37: (0, 3), 42: (0, 2), 43: (0, 2), 44: (0, 1),
               45: (0, 1), 46: (0, 0), 47: (0, 0), 48: (0, 1), 49: (0, 1), 60: (0, 1),
               61: (0, 0), 65: (0, 0), 66: (0, 2), 74: (0, 1), 75: (0, 0)}


def fetch(conn: RawConnection, topic: str, partitions: dict[int, int], *, max_wait_ms: int = 0,
          min_bytes: int = 1, max_bytes: int = 1 << 20, partition_max_bytes: int = 1 << 20
          ) -> list[Any]:
    parts = [FetchRequest.FetchTopic.FetchPartition(
        partition=p, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1,
        log_start_offset=-1, partition_max_bytes=partition_max_bytes)
        for p, offset in partitions.items()]
    request = FetchRequest[12](replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                               max_bytes=max_bytes, isolation_level=0, session_id=0,
                               session_epoch=-1, topics=[FetchRequest.FetchTopic(
                                   topic=topic, partitions=parts)],
                               forgotten_topics_data=[], rack_id="")
    return list(conn.call(request, 12, FetchResponse).responses[0].partitions)


def offsets_in(records: bytes) -> list[int]:
    found: list[int] = []
    memory = MemoryRecords(records)
    while memory.has_next():
        batch = memory.next_batch()
        found.extend(record.offset for record in batch)
    return found


def test_api_versions_lists_exactly_what_is_implemented(broker: BrokerProcess) -> None:
    conn = RawConnection(broker.port)
    answer = conn.call(ApiVersionsRequest[3](client_software_name="t",
                                             client_software_version="1"), 3,
                       ApiVersionsResponse)
    conn.close()
    assert {a.api_key: (a.min_version, a.max_version) for a in answer.api_keys} == IMPLEMENTED


def test_long_poll_is_woken_by_an_append(broker: BrokerProcess, topic_name: str) -> None:
    conn = RawConnection(broker.port, timeout=600)
    writer = RawConnection(broker.port)
    assert create(conn, topic_name) == 0
    result: list[Any] = []
    # max_wait_ms is 10 minutes: an answer within the join's bound can only be the wake-up
    poll = threading.Thread(target=lambda: result.extend(
        fetch(conn, topic_name, {0: 0}, max_wait_ms=600_000)), daemon=True)
    poll.start()
    time.sleep(0.5)
    assert not result  # still parked: nothing to read yet
    assert produce(writer, topic_name, record_batch(4)).error_code == 0
    poll.join(60)
    assert not poll.is_alive() and result, "the long poll was not woken by the append"
    assert offsets_in(result[0].records) == [0, 1, 2, 3]
    # with min_bytes not reached, the fetch waits max_wait_ms and answers what there is
    # (the wait is the property: a lower bound only, which no slow machine breaks)
    started = time.monotonic()
    answer = fetch(conn, topic_name, {0: 0}, max_wait_ms=400, min_bytes=1 << 20)
    assert time.monotonic() - started >= 0.35
    assert offsets_in(answer[0].records) == [0, 1, 2, 3]
    conn.close()
    writer.close()


def test_byte_limits(broker: BrokerProcess, topic_name: str) -> None:
    conn = RawConnection(broker.port)
    assert create(conn, topic_name, partitions=2) == 0
    value = b"v" * 1000
    for partition in (0, 1):
        for base in range(0, 30, 3):  # ten batches of three records each
            answer = produce(conn, topic_name, record_batch(3, value=value),
                             partition=partition)
            assert answer.error_code == 0 and answer.base_offset == base
    size = len(record_batch(3, value=value))
    # a partition limit smaller than one batch still returns that first batch whole
    tiny = fetch(conn, topic_name, {0: 0}, partition_max_bytes=10)
    assert offsets_in(tiny[0].records) == [0, 1, 2]
    # a fetch offset inside a batch returns the batch that holds it
    inside = fetch(conn, topic_name, {0: 4}, partition_max_bytes=size)
    assert offsets_in(inside[0].records) == [3, 4, 5]
    # partition limit of three batches
    three = fetch(conn, topic_name, {0: 0}, partition_max_bytes=3 * size)
    assert offsets_in(three[0].records) == list(range(9))
    # the response limit spans partitions: the first gets four batches, the second none
    both = fetch(conn, topic_name, {0: 0, 1: 0}, max_bytes=4 * size + 10)
    assert offsets_in(both[0].records) == list(range(12))
    assert both[1].records in (b"", None)
    assert both[1].high_watermark == 30
    conn.close()
