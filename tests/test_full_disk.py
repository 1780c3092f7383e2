"""A full disk: writes are answered with Kafka's retriable errors (produce and topic
creation: KAFKA_STORAGE_ERROR; the offsets and transaction logs: NOT_COORDINATOR, as Kafka
turns a coordinator's failed log write), the connection stays open, the cause is logged once,
reads and deletes go on, and once space returns everything carries on with nothing
acknowledged lost. SIGTERM on a full disk does every shutdown step it can and names each
one it could not.

The broker's data directory is a real, small tmpfs mounted for the test (the tests run as
root); the disk is filled with a real file, and freed by removing it.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient

from broker_core.storage import LogConfig, LogManager
from tests.broker_process import BrokerProcess
from tests.group_helpers import GroupConnection
from tests.raw import record_batch
from tests.txn_helpers import NONE, TxnConnection, batch, decode_records

KAFKA_STORAGE_ERROR = 56
NOT_COORDINATOR = 16
REBALANCE_IN_PROGRESS = 27
SMALL_TOPICS = {"offsetsTopicNumPartitions": "1", "kafkaTxnLogTopicNumPartitions": "1"}
CAUSE_LOGGED = "storage: cannot write"


class DiskConnection(TxnConnection, GroupConnection):
    """Produce, transaction and group requests over one raw connection."""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 32 MiB tmpfs mounted for this test only."""
    mount = tmp_path / "disk"
    mount.mkdir()
    try:
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)],
                                capture_output=True, text=True, timeout=30)
    except FileNotFoundError as exc:
        pytest.skip(f"no mount command: {exc}")
    if result.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)


def fill(disk: Path) -> Path:
    """Take every free byte of ``disk`` with one file; return it."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for size in (1 << 20, 1 << 16, 1 << 12, 1 << 8, 1):
            chunk = b"\0" * size
            while True:
                try:
                    os.write(fd, chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)
    return filler


def value(i: int) -> bytes:
    """A record value of 20 KB: a batch of it always needs new pages of the disk."""
    return f"record-{i:06d}-".encode() * 1400


def stored_values(conn: DiskConnection, topic: str) -> list[bytes | None]:
    """Every record value of partition 0, read with Fetch."""
    out: list[bytes | None] = []
    offset = 0
    while True:
        answer = conn.fetch(topic, 0, offset)
        assert answer.error_code == NONE, answer
        records = decode_records(answer.records or b"")
        if not records:
            return out
        out.extend(v for _, v, _ in records)
        offset = records[-1][0] + 1


def confluent_error(bootstrap: str, topic: str) -> confluent_kafka.KafkaError | None:
    """What librdkafka reports for one 20 KB record, with no retries of its own."""
    reports: list[confluent_kafka.KafkaError | None] = []
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                         "retries": 0, "enable.idempotence": False})
    producer.produce(topic, value=value(999_999), partition=0,
                     on_delivery=lambda err, _msg: reports.append(err))
    assert producer.flush(30) == 0
    return reports[0]


def test_a_full_disk_answers_retriable_errors_and_loses_nothing(
        small_disk: Path, topic_name: str) -> None:
    broker = BrokerProcess(small_disk / "data", SMALL_TOPICS).start()
    wide, doomed = f"{topic_name}-wide-" + "w" * 150, f"{topic_name}-doomed"
    acked: list[bytes | None] = []
    try:
        conn = DiskConnection(broker.port)
        for name, partitions in ((topic_name, 1), (wide, 40), (doomed, 1)):
            assert conn.create_topic(name, partitions) == NONE

        def produce(i: int) -> int:
            code, _ = conn.produce(topic_name, record_batch(1, value=value(i)))
            if code == NONE:
                acked.append(value(i))
            return code

        assert [produce(i) for i in range(5)] == [NONE] * 5
        assert conn.commit("g", -1, "", wide, {0: (1, "")}) == {0: NONE}
        pid, epoch = conn.init_ok("tx")
        assert conn.produce(doomed, record_batch(1, value=value(0)))[0] == NONE
        filler = fill(small_disk)

        # answered per partition, on a connection that stays open
        assert [produce(i) for i in range(5, 8)] == [KAFKA_STORAGE_ERROR] * 3
        error = confluent_error(broker.bootstrap, topic_name)
        assert error is not None and error.code() == KAFKA_STORAGE_ERROR
        big = "m" * 4000
        assert conn.commit("g", -1, "", wide, {p: (7, big) for p in range(3)}) == \
            dict.fromkeys(range(3), NOT_COORDINATOR)
        added = conn.add_partitions("tx", pid, epoch, {wide: list(range(40))})
        assert set(added.values()) == {NOT_COORDINATOR}
        assert conn.create_topic(f"{topic_name}-late", 1) == KAFKA_STORAGE_ERROR
        # reads go on, and so do deletes
        assert stored_values(conn, topic_name) == acked
        assert conn.offset_fetch("g", wide, [0]) == {0: 1}  # the failed commit kept nothing
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.delete_topics([doomed])[doomed].result(30)
        # one line for the cause, however many requests met it; no traceback
        assert sum(CAUSE_LOGGED in line for line in broker.lines) == 1, broker.log_text()
        assert "Traceback" not in broker.log_text()

        filler.unlink()
        assert produce(8) == NONE
        assert conn.create_topic(f"{topic_name}-late", 1) == NONE
        assert confluent_error(broker.bootstrap, topic_name) is None
        acked.append(value(999_999))
        assert conn.commit("g", -1, "", wide, {p: (7, big) for p in range(3)}) == \
            dict.fromkeys(range(3), NONE)
        assert conn.add_partitions("tx", pid, epoch, {wide: list(range(40))}) == \
            {(wide, p): NONE for p in range(40)}
        assert conn.produce(wide, batch(pid, epoch, 0, 1, transactional=True), 5)[0] == NONE
        assert conn.end_txn("tx", pid, epoch, True) == NONE
        broker.wait_for_log("storage: writes succeed again")
        conn.close()

        assert broker.stop() == 0
        broker.start()
        conn = DiskConnection(broker.port)
        assert stored_values(conn, topic_name) == acked
        assert conn.offset_fetch("g", wide, [0, 1, 2]) == dict.fromkeys(range(3), 7)
        conn.close()
    finally:
        broker.kill()


def test_a_group_write_on_a_full_disk_sends_the_members_back_to_rejoin(
        small_disk: Path, topic_name: str) -> None:
    """SyncGroup's leader assignment cannot be stored: NOT_COORDINATOR, the group rebalances
    (as Kafka does), and once space returns the members settle."""
    broker = BrokerProcess(small_disk / "data",
                           {**SMALL_TOPICS, "groupInitialRebalanceDelayMs": "0"}).start()
    try:
        conn = DiskConnection(broker.port)
        assert conn.create_topic(topic_name, 1) == NONE
        joined = conn.join_new("g", topics=(topic_name,))
        assert joined.error_code == NONE and joined.leader == joined.member_id
        filler = fill(small_disk)
        big = {joined.member_id: b"a" * 12_000}  # a record that needs new pages

        synced = conn.sync("g", joined.generation_id, joined.member_id, big)
        assert synced.error_code == NOT_COORDINATOR
        assert conn.heartbeat("g", joined.generation_id, joined.member_id) == \
            REBALANCE_IN_PROGRESS
        assert "Traceback" not in broker.log_text()

        filler.unlink()
        again = conn.join("g", joined.member_id, topics=(topic_name,))
        assert again.error_code == NONE and again.generation_id > joined.generation_id
        synced = conn.sync("g", again.generation_id, joined.member_id, big)
        assert synced.error_code == NONE and synced.assignment == big[joined.member_id]
        conn.close()
    finally:
        broker.kill()


def test_sigterm_on_a_full_disk_does_every_step_it_can(small_disk: Path,
                                                        topic_name: str) -> None:
    broker = BrokerProcess(small_disk / "data", SMALL_TOPICS).start()
    try:
        conn = DiskConnection(broker.port)
        assert conn.create_topic(topic_name, 1) == NONE
        pid, epoch = conn.init_ok(None)
        offsets = [conn.produce(topic_name, batch(pid, epoch, seq, 1))[1] for seq in range(10)]
        conn.close()
        filler = fill(small_disk)

        assert broker.stop() == 1
        steps = [line.split("shutdown: ", 1)[1] for line in broker.lines if "shutdown: " in line]
        assert any("producer snapshot" in step for step in steps), broker.log_text()
        assert any(step.startswith("could not seal ") for step in steps), broker.log_text()
        assert "Traceback" not in broker.log_text()
        broker.wait_for_log(rf"{len(steps)} shutdown step\(s\) failed")

        filler.unlink()
        broker.start()
        conn = DiskConnection(broker.port)
        # the producer's last batch, retried, is known: idempotence survived
        assert conn.produce(topic_name, batch(pid, epoch, 9, 1)) == (NONE, offsets[-1])
        assert [v for _, v, _ in decode_records(conn.fetch(topic_name).records)] == \
            [f"v-{seq}".encode() for seq in range(10)]
        conn.close()
        assert broker.stop() == 0
    finally:
        broker.kill()


def test_a_partition_that_cannot_be_sealed_does_not_stop_the_others(tmp_path: Path) -> None:
    """The others are sealed, and open at the next start without any recovery."""
    logs = LogManager(tmp_path / "data", LogConfig())
    for name in ("a", "b", "c"):
        logs.create_topic(name, 1, {})
        partition = logs.partition(name, 0)
        assert partition is not None
        for _ in range(3):
            partition.append(bytearray(record_batch(2)), 1, 0)
    moved = tmp_path / "b-elsewhere"
    (tmp_path / "data" / "topics" / "b").rename(moved)  # its metadata cannot be written

    problems = logs.close()

    assert len(problems) == 1 and problems[0].startswith("could not seal b-0:"), problems
    moved.rename(tmp_path / "data" / "topics" / "b")
    for name, sealed in (("a", True), ("b", False), ("c", True)):
        metadata = json.loads((tmp_path / "data" / "topics" / name / "0" /
                               "partition.json").read_text())
        assert metadata["ledgers"][-1]["sealed"] is sealed, (name, metadata)
    again = LogManager(tmp_path / "data", LogConfig())
    reopened = [again.partition(name, 0) for name in "abc"]
    assert [p.next_offset if p is not None else -1 for p in reopened] == [6, 6, 6]
    assert again.close() == []
