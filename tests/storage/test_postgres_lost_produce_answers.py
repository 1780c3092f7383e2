"""An idempotent produce whose group commit is stored in PostgreSQL while the database's
answer is lost (``tests/pg_proxy.py`` drops the connection after the statement ran), as a
client sees it.

Why it matters (the chaos soak's "stored twice" after a PostgreSQL restart): answered
KAFKA_STORAGE_ERROR, as it was, librdkafka takes the batch as *not persisted*; when, before
its retry is judged, any other partition of the same producer gets
OUT_OF_ORDER_SEQUENCE_NUMBER (its pipelined request behind one that really failed),
librdkafka bumps the producer's epoch and renumbers every unacknowledged message of every
partition from sequence 0: the stored batch is sent again under the new epoch, which no
producer state can recognise, and is stored a second time. So the broker reads back
whether the batch is stored and, since it is, acknowledges it at its offset.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.coordinator_failures import stored_end
from tests.pg_proxy import PgProxy
from tests.postgres_server import shared_server
from tests.raw import RawConnection

PRODUCER_ID = 4242
STARTED_MS = int(time.time() * 1000)
"""Every batch's timestamp: a retry is the same bytes, as a client sends it again."""


def _batch(sequence: int) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=PRODUCER_ID, producer_epoch=0,
                                        base_sequence=sequence, batch_size=1 << 20)
    builder.append(0, timestamp=STARTED_MS, key=b"k",
                   value=f"record {sequence}".encode(), headers=[])
    return bytes(builder.build())


def _produce(conn: RawConnection, topic: str, sequence: int) -> tuple[int, int]:
    """Produce the batch at ``sequence`` (acks=all); its (error code, base offset)."""
    data = ProduceRequest.TopicProduceData(name=topic, partition_data=[
        ProduceRequest.TopicProduceData.PartitionProduceData(index=0,
                                                             records=_batch(sequence))])
    answer: Any = conn.call(ProduceRequest[7](transactional_id=None, acks=-1,
                                              timeout_ms=30_000, topic_data=[data]),
                            7, ProduceResponse)
    partition = answer.responses[0].partition_responses[0]
    return int(partition.error_code), int(partition.base_offset)


def _lose_the_answer(tmp_path: Path, topic: str, retries: int,
                     config: dict[str, str] | None = None) -> list[tuple[int, int]]:
    """Produce sequence 1 while the database's answer to its commit is lost (stored, then
    the connection cut), and ``retries`` copies of it on other connections while that
    commit is under way; the answers, the original's first. The database answers again
    at once."""
    url = shared_server().new_database_url()
    internal = f"public/default/{topic}"
    with PgProxy(url) as proxy:
        broker = BrokerProcess(tmp_path, {"storageUrl": proxy.url}).start()
        conns = [RawConnection(broker.port, timeout=60) for _ in range(1 + retries)]
        try:
            create_topic(broker.bootstrap, topic, 1, config)
            assert _produce(conns[0], topic, 0) == (0, 0)
            before = stored_end(url, internal)
            proxy.hold()
            answers: dict[int, tuple[int, int]] = {}

            def produce(at: int) -> None:
                answers[at] = _produce(conns[at], topic, 1)

            producing = [threading.Thread(target=produce, args=(0,))]
            producing[0].start()
            deadline = time.monotonic() + 30
            while stored_end(url, internal) == before:
                assert time.monotonic() < deadline, "the commit was never stored"
                time.sleep(0.01)
            for at in range(1, 1 + retries):  # judged duplicates of the batch in flight
                producing.append(threading.Thread(target=produce, args=(at,)))
                producing[-1].start()
            time.sleep(0.5)  # the retries reach the broker (their answers wait)
            cut = 0  # its answer lost: cut once it reaches the proxy (a moment later)
            while cut == 0 and producing[0].is_alive() and time.monotonic() < deadline:
                cut += proxy.cut()
                time.sleep(0.01)
            assert cut > 0
            proxy.release()  # the database answers again: what is stored can be read
            for thread in producing:
                thread.join(60)
                assert not thread.is_alive()
            assert stored_end(url, internal) == 2  # the batch at offset 1 is stored once
            return [answers[at] for at in range(1 + retries)]
        finally:
            for conn in conns:
                conn.close()
            if broker.alive():
                broker.stop()


def test_a_produce_whose_commit_answer_was_lost_is_answered_by_what_is_stored(
        tmp_path: Path, topic_name: str) -> None:
    # stored at offset 1: answered so (KAFKA_STORAGE_ERROR would tell librdkafka that it
    # is not, and an epoch bump would then store it again)
    assert _lose_the_answer(tmp_path, topic_name, retries=0) == [(0, 1)]


def test_a_retry_of_a_batch_whose_commit_answer_was_lost_is_answered_by_what_is_stored(
        tmp_path: Path, topic_name: str) -> None:
    # a retry (a client whose connection dropped sends the batch again) judged a
    # duplicate while that commit is under way: answered by what is stored too
    assert _lose_the_answer(tmp_path, topic_name, retries=2) == [(0, 1)] * 3


def test_a_retry_on_a_log_append_time_topic_is_answered_by_what_is_stored(
        tmp_path: Path, topic_name: str) -> None:
    # the stored copy carries the broker's timestamp; the retry, the producer's: the same
    # batch all the same
    assert _lose_the_answer(tmp_path, topic_name, retries=1,
                            config={"message.timestamp.type": "LogAppendTime"}) == [(0, 1)] * 2
