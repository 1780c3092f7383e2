"""Issue 18, exactly-once end to end: a streaming copy through the ``edgekafka`` sink whose
driver (the Python process and its JVM) is killed with ``kill -9`` in the middle of a
micro-batch, when one Spark task's transaction has committed and the other's is still
open, then restarted on the same checkpoint: a read_committed reader of the output topic
gets every input record exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import confluent_kafka
import pytest

from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.pipeline_helpers import produce

PER_PARTITION = 1000
SLOW_SECONDS = "0.05"
"""Per row of input partition 1 in the first run: its task needs 50 s, partition 0's not."""
ROOT = Path(__file__).resolve().parents[2]


def read_all(bootstrap: str, topic: str, partition: int, isolation: str) -> list[bytes]:
    """Every value of ``topic``-``partition`` a reader at ``isolation`` gets now."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": "exactly-once-test",
        "enable.auto.commit": False, "enable.partition.eof": True,
        "isolation.level": isolation})
    consumer.assign([confluent_kafka.TopicPartition(topic, partition, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.5):
                error = message.error()
                if error is not None:
                    assert error.code() == confluent_kafka.KafkaError._PARTITION_EOF, error
                    return values
                value = message.value()
                assert value is not None
                values.append(value)
    finally:
        consumer.close()
    raise AssertionError(f"no end of {topic}-{partition} within 60 s")


def start_job(bootstrap: str, source: str, target: str, checkpoint: Path, log: Path,
              *extra: str) -> subprocess.Popen[bytes]:
    """The copy job in a process group of its own (its JVM and Python workers with it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.pipeline_copy_job", bootstrap, source, target,
             str(checkpoint), *extra], cwd=ROOT, env=env, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True)


def wait_until(check: Callable[[], bool], job: subprocess.Popen[bytes], log: Path,
               timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        assert job.poll() is None, f"the job ended ({job.returncode}):\n{log.read_text()[-3000:]}"
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout} s: {what}\n{log.read_text()[-3000:]}")


def wait_for_exit(job: subprocess.Popen[bytes], timeout: float) -> int | None:
    """The job's exit code, or None when it still runs after ``timeout`` seconds."""
    try:
        return job.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


@pytest.mark.timeout(900)
def test_driver_killed_mid_batch_then_restarted_writes_each_record_once(
        broker: BrokerProcess, topic_name: str, tmp_path: Path) -> None:
    bootstrap = broker.bootstrap
    source, target = topic_name, f"{topic_name}-out"
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, target, 2)
    first = [b"first-%d" % i for i in range(2 * PER_PARTITION)]
    produce(bootstrap, source, [(i % 2, None, v) for i, v in enumerate(first)])
    checkpoint, log = tmp_path / "checkpoint", tmp_path / "job.log"

    job = start_job(bootstrap, source, target, checkpoint, log, SLOW_SECONDS)
    try:
        # Partition 0's task committed its whole share of batch 0; partition 1's task has
        # records in the log (read_uncommitted) but not all of them, in an open transaction.
        wait_until(lambda: len(read_all(bootstrap, target, 0, "read_committed"))
                   == PER_PARTITION, job, log, 300, "partition 0 committed")
        wait_until(lambda: len(read_all(bootstrap, target, 1, "read_uncommitted")) > 0,
                   job, log, 120, "partition 1 writing")
        assert len(read_all(bootstrap, target, 1, "read_uncommitted")) < PER_PARTITION
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(60)
    assert read_all(bootstrap, target, 1, "read_committed") == []
    second = [b"second-%d" % i for i in range(2 * PER_PARTITION)]
    produce(bootstrap, source, [(i % 2, None, v) for i, v in enumerate(second)])

    job = start_job(bootstrap, source, target, checkpoint, log)
    try:
        assert wait_for_exit(job, 600) == 0, log.read_text()[-3000:]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(60)
    got = [v for p in (0, 1) for v in read_all(bootstrap, target, p, "read_committed")]
    assert sorted(got) == sorted(first + second)
