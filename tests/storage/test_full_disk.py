"""A full disk: writes are answered with Kafka's retriable errors (produce and topic
creation: KAFKA_STORAGE_ERROR; the offsets and transaction logs: NOT_COORDINATOR, as Kafka
turns a coordinator's failed log write), the connection stays open, the cause is logged once,
reads and deletes go on, and once space returns everything carries on with nothing
acknowledged lost. SIGTERM on a full disk does every shutdown step it can and names each
one it could not.

The broker's data directory is a real, small tmpfs mounted for the test (the tests run as
root); the disk is filled with a real file, and freed by removing it. A failing fsync is
real too: an ext4 file system on a loop device whose backing file lies on a tmpfs that is
then filled, so the kernel's writeback of new blocks fails and fsync reports it. Where
mounting is not permitted the tests skip, except under CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import base64
import collections
import errno
import json
import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import jwt
import pytest
from confluent_kafka.admin import AdminClient, OffsetSpec

from broker_core.storage import LogConfig, LogManager
from tests.broker_process import BrokerProcess
from tests.group_helpers import GroupConnection
from tests.ports import free_port
from tests.raw import record_batch
from tests.security_helpers import OpsConnection, SecureConnection, plain_message
from tests.storage_helpers import headed
from tests.txn_helpers import NONE, TxnConnection, batch, decode_records

KAFKA_STORAGE_ERROR = 56
NOT_COORDINATOR = 16
REBALANCE_IN_PROGRESS = 27
SMALL_TOPICS = {"offsetsTopicNumPartitions": "1", "kafkaTxnLogTopicNumPartitions": "1"}
SASL_AUTHENTICATION_FAILED = 58
CAUSE_LOGGED = "storage: cannot write"
OFFLINE_LOGGED = "is offline until restart"
SECRET = b"full-disk-test-secret-of-32-byte"
SASL = {"kafkaListeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "tokenSecretKey": "data:;base64," + base64.b64encode(SECRET).decode(),
        "failedAuthenticationDelayMs": "0"}


class DiskConnection(TxnConnection, GroupConnection):
    """Produce, transaction and group requests over one raw connection."""


def privileged(command: list[str], what: str) -> str:
    """Run a command that needs root; skip the test where it cannot run, but fail it under
    CI (``.ci/run`` sets CI), where a skip would hide that the test never ran."""
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        problem = result.stderr.strip() if result.returncode != 0 else None
    except FileNotFoundError as exc:
        problem = f"no {command[0]} command: {exc}"
    if problem is None:
        return result.stdout.strip()
    message = f"{what} is not possible here: {problem}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def mount_tmpfs(mount: Path, size: str) -> None:
    mount.mkdir()
    privileged(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
               "mounting a tmpfs")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 32 MiB tmpfs mounted for this test only."""
    mount = tmp_path / "disk"
    mount_tmpfs(mount, "32m")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)


@pytest.fixture
def failing_disk(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(an ext4 file system, the tmpfs that holds its loop device's sparse backing file):
    once the tmpfs is filled (:func:`fail_writeback`), writing back new blocks of the ext4
    fails, and so does the fsync that waits for them."""
    outer, inner = tmp_path / "backing", tmp_path / "ext4"
    mount_tmpfs(outer, "24m")
    device = None
    try:
        backing = outer / "ext4.img"
        with open(backing, "wb") as image:
            image.truncate(256 << 20)
        privileged(["mkfs.ext4", "-q", "-F", "-b", "4096", "-O", "^has_journal",
                    str(backing)], "making an ext4 file system")
        device = privileged(["losetup", "-f", "--show", str(backing)], "a loop device")
        inner.mkdir()
        privileged(["mount", device, str(inner)], "mounting a loop device")
        yield inner, outer
    finally:
        subprocess.run(["umount", "-l", str(inner)], capture_output=True, timeout=30)
        if device is not None:
            subprocess.run(["losetup", "-d", device], capture_output=True, timeout=30)
        subprocess.run(["umount", "-l", str(outer)], capture_output=True, timeout=30)


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


def fail_writeback(ext4: Path, backing: Path) -> Path:
    """Make every free block of ``ext4`` a hole in its backing file (fstrim: the loop
    device punches them out of the tmpfs), then fill the tmpfs: from now on any block
    written anew cannot be written back. Returns the filler."""
    privileged(["fstrim", str(ext4)], "trimming an ext4 on a loop device")
    return fill(backing)


def value(i: int) -> bytes:
    """A record value of 20 KB: a batch of it always needs new pages of the disk."""
    return f"record-{i:06d}-".encode() * 1400


def stored_values(conn: DiskConnection, topic: str, offset: int = 0) -> list[bytes | None]:
    """Every record value of partition 0 from ``offset``, read with Fetch."""
    out: list[bytes | None] = []
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


def token() -> str:
    return jwt.encode({"sub": "alice", "exp": int(time.time()) + 600}, SECRET,
                      algorithm="HS256")


def log_in(bootstrap: str) -> None:
    """A good SASL/PLAIN login with librdkafka, and one request after it."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanisms": "PLAIN", "sasl.username": "alice",
                         "sasl.password": "token:" + token()})
    assert admin.list_topics(timeout=20).brokers


def fail_to_log_in(port: int) -> None:
    """A SASL/PLAIN login with a forged token, refused."""
    conn = SecureConnection(port)
    try:
        assert conn.handshake("PLAIN").error_code == NONE
        answer = conn.authenticate(plain_message("alice", "token:forged"))
        assert answer.error_code == SASL_AUTHENTICATION_FAILED, answer
    finally:
        conn.close()


def causes(broker: BrokerProcess) -> collections.Counter[str]:
    """How many times each kind of write was logged as failing."""
    return collections.Counter(line.split("; ", 1)[1].split(" are answered")[0]
                               for line in broker.lines if CAUSE_LOGGED in line)


def earliest(bootstrap: str, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tp = confluent_kafka.TopicPartition(topic, 0)
    return int(admin.list_offsets({tp: OffsetSpec.earliest()})[tp].result(20).offset)


def test_a_full_disk_answers_retriable_errors_and_loses_nothing(
        small_disk: Path, topic_name: str) -> None:
    broker = BrokerProcess(small_disk / "data", {**SMALL_TOPICS, **SASL}).start()
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
        # DeleteRecords cannot write the new log start: it fails and moves nothing
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        cut = confluent_kafka.TopicPartition(topic_name, 0, 2)
        with pytest.raises(confluent_kafka.KafkaException) as refused:
            admin.delete_records([cut])[cut].result(30)
        assert refused.value.args[0].code() == KAFKA_STORAGE_ERROR
        assert earliest(broker.bootstrap, topic_name) == 0
        # logins go on; their audit events cannot be written
        log_in(f"127.0.0.1:{broker.ports['SASL_PLAINTEXT']}")
        fail_to_log_in(broker.ports["SASL_PLAINTEXT"])
        broker.wait_for_log(f"{CAUSE_LOGGED} an audit event")
        # reads go on, and so do deletes
        assert stored_values(conn, topic_name) == acked
        assert conn.offset_fetch("g", wide, [0]) == {0: 1}  # the failed commit kept nothing
        admin.delete_topics([doomed])[doomed].result(30)
        # one line per kind of write that met the cause, however many requests met it;
        # no traceback
        assert {"record appends", "coordinator state writes", "topic creations and configs",
                "log start moves", "audit events"} <= set(causes(broker)), broker.log_text()
        assert set(causes(broker).values()) == {1}, broker.log_text()
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
        assert conn.produce(wide, batch(pid, epoch, 0, 1, transactional=True), 5, "tx")[0] == NONE
        assert conn.end_txn("tx", pid, epoch, True) == NONE
        broker.wait_for_log("storage: record appends succeed again")
        log_in(f"127.0.0.1:{broker.ports['SASL_PLAINTEXT']}")
        broker.wait_for_log("storage: audit events succeed again")
        assert admin.delete_records([cut])[cut].result(30).low_watermark == 2
        del acked[:2]
        conn.close()

        assert broker.stop() == 0
        broker.start()
        conn = DiskConnection(broker.port)
        assert stored_values(conn, topic_name, 2) == acked
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
            partition.append(*headed(bytearray(record_batch(2))))
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


def scrape_offline(port: int, topic: str) -> float:
    """``kop_server_log_offline`` of partition 0 of ``topic``."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found = re.search(r'kop_server_log_offline\{partition="0",topic="public/default/'
                      + re.escape(topic) + r'"\} (\S+)', text)
    assert found, text
    return float(found[1])


def test_a_failed_fsync_takes_the_partition_offline_until_restart(
        failing_disk: tuple[Path, Path], topic_name: str) -> None:
    """After a failed fsync the kernel may have dropped the pages it could not write (a
    later fsync succeeds all the same), so the record must not be served or retried into
    the same file: the partition answers KAFKA_STORAGE_ERROR to reads and writes until
    the broker restarts; a commit whose fsync failed is not kept, and the groups of an
    offsets partition that went offline answer NOT_COORDINATOR until the restart."""
    ext4, backing = failing_disk
    metrics_port = free_port()
    broker = BrokerProcess(ext4 / "data", {**SMALL_TOPICS, "flushIntervalMessages": "1",
                                           "metricsPort": str(metrics_port)}).start()
    try:
        conn = DiskConnection(broker.port)
        assert conn.create_topic(topic_name, 3) == NONE
        acked = [value(i) for i in range(3)]
        assert [conn.produce(topic_name, record_batch(1, value=v))[0] for v in acked] == \
            [NONE] * 3
        assert conn.commit("g", -1, "", topic_name, {0: (1, "")}) == {0: NONE}
        assert scrape_offline(metrics_port, topic_name) == 0
        ops = OpsConnection(broker.port)
        assert ops.describe_group("g").error_code == NONE and "g" in ops.list_groups()
        ops.close()
        filler = fail_writeback(ext4, backing)

        # a write may still land on blocks of the file system that were written before;
        # within a few records one needs a block that cannot be written back
        outcomes = [conn.produce(topic_name, record_batch(1, value=value(i)))[0]
                    for i in range(3, 23)]
        assert KAFKA_STORAGE_ERROR in outcomes, outcomes
        acked += [value(i) for i, code in enumerate(outcomes, 3) if code == NONE]
        assert outcomes[outcomes.index(KAFKA_STORAGE_ERROR):] == \
            [KAFKA_STORAGE_ERROR] * (len(outcomes) - outcomes.index(KAFKA_STORAGE_ERROR))
        broker.wait_for_log(OFFLINE_LOGGED)
        offline = [line for line in broker.lines if OFFLINE_LOGGED in line]
        assert len(offline) == 1 and f"{topic_name}/0" in offline[0], broker.log_text()
        # the partition is offline: reads and writes fail, without another line
        assert conn.fetch(topic_name).error_code == KAFKA_STORAGE_ERROR
        assert scrape_offline(metrics_port, topic_name) == 1
        # a commit whose fsync fails is answered NOT_COORDINATOR and not kept
        kept = {0: 1, 1: -1, 2: -1}
        for offset in range(10, 30):
            commit = {p: (offset, "m" * 4000) for p in range(3)}  # needs new blocks
            answer = conn.commit("g", -1, "", topic_name, commit)
            if answer != dict.fromkeys(range(3), NONE):
                break
            kept = dict.fromkeys(range(3), offset)
        assert answer == dict.fromkeys(range(3), NOT_COORDINATOR), answer
        # the offsets partition is offline: its groups are not served from memory, reads
        # included (Kafka's coordinator no longer owns it); clients look for it again
        assert conn.fetch_offsets("g", topic_name, [0, 1, 2]) == (NOT_COORDINATOR, {})
        ops = OpsConnection(broker.port)
        assert ops.describe_group("g").error_code == NOT_COORDINATOR
        assert "g" not in ops.list_groups()
        ops.close()
        assert sum(f"{topic_name}/0" in line for line in broker.lines
                   if OFFLINE_LOGGED in line) == 1
        assert "Traceback" not in broker.log_text()
        conn.close()

        filler.unlink()
        broker.stop()  # the offline partitions are left unsealed, for recovery
        broker.start()
        conn = DiskConnection(broker.port)
        assert conn.produce(topic_name, record_batch(1, value=value(99)))[0] == NONE
        stored = stored_values(conn, topic_name)
        assert stored[:len(acked)] == acked and stored[-1] == value(99)
        # served again after the restart, with every acknowledged commit
        error, offsets = conn.fetch_offsets("g", topic_name, [0, 1, 2])
        assert error == NONE and all(offsets[p][0] >= kept[p] for p in range(3)), offsets
        conn.close()
    finally:
        broker.kill()


def test_a_mount_that_fails_skips_but_fails_under_ci(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    """A developer without root sees these tests skipped; CI (``.ci/run`` sets CI=true)
    sees them fail, so they cannot silently stop running there."""
    impossible = ["mount", "-t", "no-such-file-system", "none", str(tmp_path)]
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="mounting is not possible here"):
        privileged(impossible, "mounting")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="mounting is not possible here"):
        privileged(impossible, "mounting")


def test_an_offline_transaction_log_partition_answers_not_coordinator(
        failing_disk: tuple[Path, Path]) -> None:
    """The transaction state of a partition that went offline after a failed fsync is not
    served from memory: DescribeTransactions and InitProducerId get NOT_COORDINATOR and
    ListTransactions leaves its ids out, until the broker restarts."""
    ext4, backing = failing_disk
    broker = BrokerProcess(ext4 / "data", {**SMALL_TOPICS, "flushIntervalMessages": "1"}).start()
    try:
        conn = DiskConnection(broker.port)
        conn.init_ok("tx-kept")
        assert conn.describe_transactions(["tx-kept"]).transaction_states[0].error_code == NONE
        listed = conn.list_transactions().transaction_states
        assert [t.transactional_id for t in listed] == ["tx-kept"]
        fail_writeback(ext4, backing)
        # long ids: each state record needs blocks that cannot be written back
        codes = [int(conn.init_pid(f"tx-{i}-" + "x" * 3000).error_code) for i in range(20)]
        assert NOT_COORDINATOR in codes, codes
        broker.wait_for_log(OFFLINE_LOGGED + ".*__transaction_state|__transaction_state.*"
                            + OFFLINE_LOGGED)
        assert conn.describe_transactions(["tx-kept"]).transaction_states[0].error_code == \
            NOT_COORDINATOR
        answer = conn.list_transactions()
        assert answer.error_code == NONE and answer.transaction_states == [], answer
        assert conn.init_pid("tx-kept").error_code == NOT_COORDINATOR
        assert "Traceback" not in broker.log_text()
        conn.close()
    finally:
        broker.kill()
