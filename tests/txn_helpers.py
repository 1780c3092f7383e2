"""Helpers for the transaction and idempotence acceptance tests: brokers with fast
transaction settings, exact transaction requests over a raw connection, hand-built
idempotent/transactional batches, readers with an isolation level, and the worker
processes the crash and exactly-once tests run (``python -m tests.txn_helpers ...``)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import confluent_kafka
from kafka.protocol.admin import (
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DescribeProducersRequest,
    DescribeProducersResponse,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
)
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)
from kafka.record.memory_records import MemoryRecords

from tests.batches import build_batch
from tests.broker_process import BrokerProcess
from tests.raw import RawConnection

# Kafka error codes used by the transaction tests.
NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
COORDINATOR_LOAD_IN_PROGRESS = 14
TOPIC_AUTHORIZATION_FAILED = 29
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
INVALID_TRANSACTION_TIMEOUT = 50
CONCURRENT_TRANSACTIONS = 51
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
OPERATION_NOT_ATTEMPTED = 55
PRODUCER_FENCED = 90
TRANSACTIONAL_ID_NOT_FOUND = 105
INVALID_REGULAR_EXPRESSION = 128

READ_UNCOMMITTED = 0
READ_COMMITTED = 1

#: Broker settings for fast transaction tests: timed-out transactions are found within
#: half a second and groups rebalance without the initial delay.
FAST_TXN = {
    "transactionAbortTimedOutTransactionsIntervalMs": "500",
    "groupInitialRebalanceDelayMs": "0",
    "groupMinSessionTimeoutMs": "1000",
}


def start_broker(data_dir: Path, **settings: str) -> BrokerProcess:
    """A broker with FAST_TXN, overridden by ``settings``."""
    return BrokerProcess(data_dir, {**FAST_TXN, **settings}).start()


def wait_until(condition: Any, timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll ``condition()`` until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# -- batches -------------------------------------------------------------------------------

def batch(producer_id: int, epoch: int, sequence: int, count: int = 1,
          transactional: bool = False, prefix: str = "v") -> bytes:
    """A v2 batch of ``count`` records of an idempotent/transactional producer; record i
    has value ``{prefix}-{sequence + i}``."""
    records = [(f"k{sequence + i}".encode(), f"{prefix}-{sequence + i}".encode())
               for i in range(count)]
    return bytes(build_batch(records, timestamp=int(time.time() * 1000), timestamp_step=0,
                             producer_id=producer_id, producer_epoch=epoch,
                             base_sequence=sequence, transactional=transactional))


def decode_records(raw: bytes) -> list[tuple[int, bytes | None, bool]]:
    """(offset, value, is_control) of every record in fetched bytes."""
    out: list[tuple[int, bytes | None, bool]] = []
    records = MemoryRecords(raw)
    while records.has_next():
        b = records.next_batch()
        if b is None:
            break
        control = bool(getattr(b, "is_control_batch", False))
        for rec in b:
            out.append((rec.offset, rec.value, control))
    return out


# -- a raw connection with one method per transaction request ------------------------------

class TxnConnection(RawConnection):
    """A RawConnection with helpers for the transaction APIs (error codes as ints)."""

    def create_topic(self, name: str, partitions: int = 1) -> int:
        topic = CreateTopicsRequest.CreatableTopic(
            name=name, num_partitions=partitions, replication_factor=1, assignments=[],
            configs=[])
        answer = self.call(CreateTopicsRequest[5](topics=[topic], timeout_ms=5000,
                                                  validate_only=False), 5, CreateTopicsResponse)
        return int(answer.topics[0].error_code)

    def init_pid(self, transactional_id: str | None, timeout_ms: int = 60_000,
                 version: int = 4, producer_id: int = -1, epoch: int = -1) -> Any:
        kwargs: dict[str, Any] = {"transactional_id": transactional_id,
                                  "transaction_timeout_ms": timeout_ms}
        if version >= 3:
            kwargs.update(producer_id=producer_id, producer_epoch=epoch)
        return self.call(InitProducerIdRequest[version](**kwargs), version,
                         InitProducerIdResponse)

    def init_ok(self, transactional_id: str | None, timeout_ms: int = 60_000) -> tuple[int, int]:
        """InitProducerId that must succeed (retrying while the coordinator loads)."""
        deadline = time.monotonic() + 20
        while True:
            answer = self.init_pid(transactional_id, timeout_ms)
            if answer.error_code in (COORDINATOR_LOAD_IN_PROGRESS, CONCURRENT_TRANSACTIONS) \
                    and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            assert answer.error_code == NONE, answer
            return int(answer.producer_id), int(answer.producer_epoch)

    def add_partitions(self, transactional_id: str, producer_id: int, epoch: int,
                       topics: dict[str, list[int]], version: int = 3,
                       verify_only: bool = False) -> dict[tuple[str, int], int]:
        """AddPartitionsToTxn (``verify_only``: the batched form's, version 4 or later);
        the error of every partition."""
        R = AddPartitionsToTxnRequest
        if version < 4:
            request = R[version](
                v3_and_below_transactional_id=transactional_id,
                v3_and_below_producer_id=producer_id, v3_and_below_producer_epoch=epoch,
                v3_and_below_topics=[R.AddPartitionsToTxnTopic(name=t, partitions=ps)
                                     for t, ps in topics.items()])
            answer = self.call(request, version, AddPartitionsToTxnResponse)
            results = answer.results_by_topic_v3_and_below
        else:
            request = R[version](transactions=[R.AddPartitionsToTxnTransaction(
                transactional_id=transactional_id, producer_id=producer_id,
                producer_epoch=epoch, verify_only=verify_only,
                topics=[R.AddPartitionsToTxnTransaction.AddPartitionsToTxnTopic(
                    name=t, partitions=ps) for t, ps in topics.items()])])
            answer = self.call(request, version, AddPartitionsToTxnResponse)
            assert answer.error_code == NONE, answer
            results = answer.results_by_transaction[0].topic_results
        return {(t.name, p.partition_index): int(p.partition_error_code)
                for t in results for p in t.results_by_partition}

    def add_offsets(self, transactional_id: str, producer_id: int, epoch: int, group: str,
                    version: int = 3) -> int:
        return int(self.call(AddOffsetsToTxnRequest[version](
            transactional_id=transactional_id, producer_id=producer_id, producer_epoch=epoch,
            group_id=group), version, AddOffsetsToTxnResponse).error_code)

    def end_txn(self, transactional_id: str, producer_id: int, epoch: int, commit: bool,
                version: int = 3) -> int:
        return int(self.call(EndTxnRequest[version](
            transactional_id=transactional_id, producer_id=producer_id, producer_epoch=epoch,
            committed=commit), version, EndTxnResponse).error_code)

    def txn_offset_commit(self, transactional_id: str, group: str, producer_id: int,
                          epoch: int, topic: str, offsets: dict[int, int],
                          version: int = 3) -> dict[int, int]:
        R = TxnOffsetCommitRequest
        T = R.TxnOffsetCommitRequestTopic
        parts = []
        for p, o in offsets.items():
            kw: dict[str, Any] = {"partition_index": p, "committed_offset": o,
                                  "committed_metadata": ""}
            if version >= 2:
                kw["committed_leader_epoch"] = -1
            parts.append(T.TxnOffsetCommitRequestPartition(**kw))
        kwargs: dict[str, Any] = {"transactional_id": transactional_id, "group_id": group,
                                  "producer_id": producer_id, "producer_epoch": epoch,
                                  "topics": [T(name=topic, partitions=parts)]}
        if version >= 3:
            kwargs.update(generation_id=-1, member_id="", group_instance_id=None)
        answer = self.call(R[version](**kwargs), version, TxnOffsetCommitResponse)
        return {p.partition_index: int(p.error_code)
                for t in answer.topics for p in t.partitions}

    def write_markers(self, producer_id: int, epoch: int, commit: bool,
                      topics: dict[str, list[int]], coordinator_epoch: int = 0,
                      version: int = 1) -> dict[tuple[str, int], int]:
        """WriteTxnMarkers of one marker; the error of every partition."""
        M = WriteTxnMarkersRequest.WritableTxnMarker
        marker = M(producer_id=producer_id, producer_epoch=epoch, transaction_result=commit,
                   topics=[M.WritableTxnMarkerTopic(name=t, partition_indexes=ps)
                           for t, ps in topics.items()],
                   coordinator_epoch=coordinator_epoch)
        answer = self.call(WriteTxnMarkersRequest[version](markers=[marker]), version,
                           WriteTxnMarkersResponse)
        return {(t.name, p.partition_index): int(p.error_code)
                for m in answer.markers for t in m.topics for p in t.partitions}

    def produce(self, topic: str, records: bytes, partition: int = 0,
                transactional_id: str | None = None) -> tuple[int, int]:
        """(error code, base offset) of one produced batch (v9, acks=all)."""
        return self.produce_many(topic, {partition: records}, transactional_id)[partition]

    def produce_many(self, topic: str, batches: dict[int, bytes],
                     transactional_id: str | None = None) -> dict[int, tuple[int, int]]:
        """One request (v9, acks=all) of a batch for each partition: (error code, base
        offset) by partition."""
        data = ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=partition,
                                                                 records=records)
            for partition, records in batches.items()])
        answer = self.call(ProduceRequest[9](transactional_id=transactional_id, acks=-1,
                                             timeout_ms=5000, topic_data=[data]), 9,
                           ProduceResponse)
        return {int(part.index): (int(part.error_code), int(part.base_offset))
                for part in answer.responses[0].partition_responses}

    def list_offset(self, topic: str, partition: int = 0, isolation: int = READ_UNCOMMITTED,
                    timestamp: int = -1) -> int:
        """ListOffsets v7 latest (or ``timestamp``) with an isolation level."""
        part = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
            partition_index=partition, current_leader_epoch=-1, timestamp=timestamp)
        answer = self.call(ListOffsetsRequest[7](replica_id=-1, isolation_level=isolation,
                                                 topics=[ListOffsetsRequest.ListOffsetsTopic(
                                                     name=topic, partitions=[part])]), 7,
                           ListOffsetsResponse)
        got = answer.topics[0].partitions[0]
        assert got.error_code == NONE, got
        return int(got.offset)

    def fetch(self, topic: str, partition: int = 0, offset: int = 0,
              isolation: int = READ_UNCOMMITTED) -> Any:
        """One partition's Fetch v11 answer (no waiting)."""
        part = FetchRequest.FetchTopic.FetchPartition(
            partition=partition, current_leader_epoch=-1, fetch_offset=offset,
            last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=8 << 20)
        request = FetchRequest[11](replica_id=-1, max_wait_ms=0, min_bytes=0,
                                   max_bytes=8 << 20, isolation_level=isolation, session_id=0,
                                   session_epoch=-1, topics=[FetchRequest.FetchTopic(
                                       topic=topic, partitions=[part])],
                                   forgotten_topics_data=[], rack_id="")
        return self.call(request, 11, FetchResponse).responses[0].partitions[0]

    def delete_records(self, topic: str, offset: int, partition: int = 0) -> tuple[int, int]:
        """DeleteRecords v2 of one partition: (error code, low watermark)."""
        request = DeleteRecordsRequest[2](topics=[DeleteRecordsRequest.DeleteRecordsTopic(
            name=topic, partitions=[DeleteRecordsRequest.DeleteRecordsTopic
                                    .DeleteRecordsPartition(partition_index=partition,
                                                            offset=offset)])],
            timeout_ms=5000)
        answer = self.call(request, 2, DeleteRecordsResponse).topics[0].partitions[0]
        return answer.error_code, answer.low_watermark

    def committed_values(self, topic: str, partition: int = 0) -> list[bytes | None]:
        """Values a read_committed reader keeps: data below the LSO minus aborted ones."""
        answer = self.fetch(topic, partition, 0, READ_COMMITTED)
        assert answer.error_code == NONE, answer
        aborted = sorted((a.first_offset, a.producer_id)
                         for a in answer.aborted_transactions or [])
        out: list[bytes | None] = []
        records = MemoryRecords(answer.records or b"")
        active_aborted: set[int] = set()
        while records.has_next():
            b = records.next_batch()
            if b is None:
                break
            while aborted and aborted[0][0] <= b.base_offset:  # as the Java consumer does
                active_aborted.add(aborted.pop(0)[1])
            if b.is_control_batch:
                active_aborted.discard(b.producer_id)
                continue
            if b.is_transactional and b.producer_id in active_aborted:
                continue
            out.extend(rec.value for rec in b)
        return out

    def offset_fetch(self, group: str, topic: str, partitions: Iterable[int],
                     version: int = 5) -> dict[int, int]:
        """Committed offsets of a group (-1 when none)."""
        parts = list(partitions)
        request = OffsetFetchRequest[version](group_id=group, topics=[
            OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=parts)])
        answer = self.call(request, version, OffsetFetchResponse)
        assert answer.error_code == NONE, answer
        return {p.partition_index: int(p.committed_offset)
                for t in answer.topics for p in t.partitions}

    def describe_producers(self, topic: str, partitions: list[int]) -> Any:
        request = DescribeProducersRequest[0](topics=[DescribeProducersRequest.TopicRequest(
            name=topic, partition_indexes=partitions)])
        return self.call(request, 0, DescribeProducersResponse)

    def describe_transactions(self, ids: list[str]) -> Any:
        return self.call(DescribeTransactionsRequest[0](transactional_ids=ids), 0,
                         DescribeTransactionsResponse)

    def list_transactions(self, states: list[str] | None = None,
                          producer_ids: list[int] | None = None, version: int = 0,
                          duration: int = -1, pattern: str | None = None) -> Any:
        kwargs: dict[str, Any] = {"state_filters": states or [],
                                  "producer_id_filters": producer_ids or []}
        if version >= 1:
            kwargs["duration_filter"] = duration
        if version >= 2:
            kwargs["transactional_id_pattern"] = pattern
        return self.call(ListTransactionsRequest[version](**kwargs), version,
                         ListTransactionsResponse)


# -- reading with real clients -------------------------------------------------------------

def end_offsets(bootstrap: str, topic: str, partitions: int, isolation: int) -> dict[int, int]:
    """Latest offsets (high watermark or last stable offset) of every partition."""
    conn = TxnConnection(int(bootstrap.rsplit(":", 1)[1]))
    try:
        return {p: conn.list_offset(topic, p, isolation) for p in range(partitions)}
    finally:
        conn.close()


def read_all(bootstrap: str, topic: str, partitions: int, isolation: str,
             ends: dict[int, int] | None = None, timeout: float = 30.0,
             extra: dict[str, Any] | None = None) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of everything a confluent consumer with ``isolation``
    (``read_committed``/``read_uncommitted``) reads from offset 0 until its position reaches
    ``ends`` (by default the latest offsets for that isolation level) on every partition."""
    if ends is None:
        ends = end_offsets(bootstrap, topic, partitions,
                           READ_COMMITTED if isolation == "read_committed" else READ_UNCOMMITTED)
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": "txn-reader-unused",
        "enable.auto.commit": False, "isolation.level": isolation,
        "auto.offset.reset": "earliest", **(extra or {})})
    tps = [confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)]
    consumer.assign(tps)
    got: list[tuple[int, int, bytes]] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            for msg in consumer.consume(1000, 0.2):
                error = msg.error()
                if error is not None:
                    if error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                        continue
                    raise AssertionError(error)
                got.append((int(msg.partition() or 0), int(msg.offset() or 0),
                            bytes(msg.value() or b"")))
            positions = {tp.partition: tp.offset for tp in consumer.position(
                [confluent_kafka.TopicPartition(topic, p) for p in range(partitions)])}
            if all(positions[p] >= ends[p] or ends[p] == 0 for p in range(partitions)):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"reader stuck at {positions}, wanted {ends}; "
                                     f"{len(got)} records read")
    finally:
        consumer.close()
    return got


def visible_within(bootstrap: str, topic: str, partitions: int, isolation: str,
                   seconds: float) -> list[tuple[int, int, bytes]]:
    """Everything a consumer reads from offset 0 within ``seconds`` (for "not visible")."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": "txn-reader-unused",
        "enable.auto.commit": False, "isolation.level": isolation,
        "auto.offset.reset": "earliest"})
    consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[tuple[int, int, bytes]] = []
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.2):
                if msg.error() is None:
                    got.append((int(msg.partition() or 0), int(msg.offset() or 0),
                                bytes(msg.value() or b"")))
    finally:
        consumer.close()
    return got


def produce_plain(bootstrap: str, topic: str, values: list[tuple[int, bytes]]) -> None:
    """Produce (partition, value) pairs with a plain acks=all producer."""
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                         "linger.ms": 5, "enable.idempotence": False})
    errors: list[object] = []

    def report(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    for partition, value in values:
        producer.produce(topic, value=value, partition=partition, on_delivery=report)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert errors == []


# -- worker processes ------------------------------------------------------------------------

def eos_worker(bootstrap: str, source: str, sink: str, group: str, transactional_id: str,
               batch_size: int, pause_at: int = -1) -> None:
    """Consume-transform-produce exactly once: each transaction writes ``out:<value>`` for a
    polled batch and commits the consumed positions with send_offsets_to_transaction.
    Prints ``committed <n>`` after every commit (total records this process committed); once
    ``pause_at`` records are committed, the next transaction prints ``open <n>`` after its
    records are written and pauses for 3 s before committing."""
    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "transactional.id": transactional_id,
        "linger.ms": 5, "transaction.timeout.ms": 20_000})
    producer.init_transactions(30)
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed",
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "session.timeout.ms": 3000, "heartbeat.interval.ms": 300,
        "partition.assignment.strategy": "range"})
    consumer.subscribe([source])
    print("started", flush=True)
    done = 0
    while True:
        msgs = consumer.consume(batch_size, 0.5)
        msgs = [m for m in msgs if m.error() is None]
        if not msgs:
            continue
        producer.begin_transaction()
        for m in msgs:
            producer.produce(sink, value=b"out:" + (m.value() or b""), key=m.key(),
                             partition=int(m.partition() or 0))
        producer.flush(30)
        if 0 <= pause_at <= done:
            pause_at = -1
            print(f"open {done}", flush=True)  # records written, transaction not committed
            time.sleep(3)  # time for the test to kill this process mid-transaction
        positions = consumer.position(consumer.assignment())
        producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
        done += len(msgs)
        print(f"committed {done}", flush=True)


def crash_producer(bootstrap: str, topic: str, transactional_id: str, tag: str,
                   partitions: int, per_partition: int) -> None:
    """Open a transaction over every partition with ``per_partition`` records each, flush,
    print ``committing``, then commit (the test kills the broker meanwhile)."""
    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "transactional.id": transactional_id,
        "linger.ms": 20, "batch.num.messages": 10_000, "message.timeout.ms": 30_000})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(per_partition):
        for p in range(partitions):
            producer.produce(topic, value=f"{tag}:{p}:{i}".encode(), partition=p)
        if i % 200 == 0:
            producer.poll(0)
    producer.flush(30)
    print("committing", flush=True)
    try:
        producer.commit_transaction(20)
        print("committed", flush=True)
    except confluent_kafka.KafkaException as exc:
        print(f"commit failed: {exc}", flush=True)


def main(argv: list[str]) -> None:
    command, *args = argv
    if command == "eos":
        bootstrap, source, sink, group, tid, size, pause_at = args
        eos_worker(bootstrap, source, sink, group, tid, int(size), int(pause_at))
    elif command == "crash-producer":
        bootstrap, topic, tid, tag, partitions, per_partition = args
        crash_producer(bootstrap, topic, tid, tag, int(partitions), int(per_partition))
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main(sys.argv[1:])
