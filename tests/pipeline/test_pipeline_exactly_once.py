"""Issue 18, exactly-once end to end: a streaming copy through the ``edgekafka`` sink whose
driver (the Python process and its JVM) is killed with ``kill -9`` in the middle of a
micro-batch, then restarted on the same checkpoint: a read_committed reader of the output
topic gets every input record exactly once.

With ``atomicity=batch`` (the default) the driver is killed once while the tasks stage a
batch and once while the driver copies it, and right after each kill a read_committed
reader sees whole micro-batches only (each input value names its partition and offset,
and the checkpoint's offset log says which offsets each batch holds). With
``atomicity=partition`` it is killed when one task's transaction has committed and the
other's is still open; and the stage feeding one task fails mid-batch (its input cut
short, the JVM alive): the task commits nothing."""

from __future__ import annotations

import json
import os
import re
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
from tests.pipeline_helpers import produce, read_all, read_values

pytestmark = pytest.mark.long_running(minutes=11)


PER_PARTITION = 1000
SLOW_SECONDS = "0.05"
"""Per row of input partition 1 in the first run: its task needs 50 s, partition 0's not."""
BATCH_INPUT = 600
"""Input partitions for the batch-atomicity test: 2 x BATCH_INPUT records."""
MAX_OFFSETS = "400"
"""maxOffsetsPerTrigger there: micro-batches of 200 records per input partition."""
BATCH_ROWS = int(MAX_OFFSETS) // 2
"""Rows of each input partition in a micro-batch of the batch-atomicity test."""
BATCH_SLOW_SECONDS = "0.08"
"""Per row of input partition 1 from batch 1 on, in the run killed while staging: 16 s per
batch (batch 0 goes at full speed)."""
COPY_PAUSE_MS = "40"
"""copyPauseMs in the run killed mid-copy: a batch's copy takes 16 s."""
ROOT = Path(__file__).resolve().parents[2]


def written(bootstrap: str, topic: str, partitions: int) -> int:
    """The sum of the partitions' high watermarks (records, transaction markers too)."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap,
                                         "group.id": "exactly-once-test",
                                         "isolation.level": "read_uncommitted"})
    try:
        consumer.list_topics(topic, timeout=30)  # the partitions' leaders
        return sum(consumer.get_watermark_offsets(confluent_kafka.TopicPartition(
            topic, p), timeout=30)[1] for p in range(partitions))
    finally:
        consumer.close()


def marker(bootstrap: str, group: str, topic: str) -> int:
    """The batch marker: ``group``'s committed offset on ``topic`` partition 0."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                         "isolation.level": "read_committed"})
    try:
        return int(consumer.committed([confluent_kafka.TopicPartition(topic, 0)],
                                      timeout=30)[0].offset)
    finally:
        consumer.close()


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


def kill(job: subprocess.Popen[bytes]) -> None:
    """``kill -9`` the job's driver, JVM and Python workers."""
    os.killpg(job.pid, signal.SIGKILL)
    job.wait(60)


def wait_for_exit(job: subprocess.Popen[bytes], timeout: float) -> int | None:
    """The job's exit code, or None when it still runs after ``timeout`` seconds."""
    try:
        return job.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def run_to_end(job: subprocess.Popen[bytes], log: Path) -> None:
    try:
        assert wait_for_exit(job, 600) == 0, log.read_text()[-3000:]
    finally:
        if job.poll() is None:
            kill(job)


def two_partition_copy(bootstrap: str, source: str, target: str, prefix: str) -> list[bytes]:
    """Source and target topics of 2 partitions, the source holding PER_PARTITION values
    ``<prefix>-<i>`` in each partition (even ``i`` in 0, odd in 1); the values."""
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, target, 2)
    values = [b"%s-%d" % (prefix.encode(), i) for i in range(2 * PER_PARTITION)]
    produce(bootstrap, source, [(i % 2, None, v) for i, v in enumerate(values)])
    return values


@pytest.mark.timeout(1200)
def test_partition_atomicity_input_cut_short_or_driver_killed_writes_each_record_once(
        broker: BrokerProcess, topic_name: str, tmp_path: Path) -> None:
    """Two interruptions of one copy (one test: each Spark start costs the suite), then a
    run to the end: every record once. First the stage feeding partition 1's task fails
    mid-batch (its input cut short, the JVM alive and closing the worker's input): the task
    must not commit the rows it got, or the marker would say the batch is written and the
    restart would skip the rest of it. Then the driver is killed with partition 0's share
    committed and partition 1's transaction open."""
    bootstrap, source, target = broker.bootstrap, topic_name, f"{topic_name}-out"
    first = two_partition_copy(bootstrap, source, target, "first")
    checkpoint, log = tmp_path / "checkpoint", tmp_path / "job.log"

    job = start_job(bootstrap, source, target, checkpoint, log, "--slow", "0.01",
                    "--fail-after", "500", "--atomicity", "partition")
    assert wait_for_exit(job, 600) not in (0, None), log.read_text()[-3000:]
    if job.poll() is None:
        kill(job)
    assert read_all(bootstrap, target, 1, "read_committed") == [], log.read_text()[-3000:]
    aborted = len(read_all(bootstrap, target, 1, "read_uncommitted"))  # the cut input's rows

    job = start_job(bootstrap, source, target, checkpoint, log, "--slow", SLOW_SECONDS,
                    "--atomicity", "partition")
    try:
        # Partition 0's task committed its whole share of batch 0 (in this run or the
        # first); partition 1's task has records in the log (read_uncommitted) but not
        # all of them, in an open transaction.
        wait_until(lambda: len(read_all(bootstrap, target, 0, "read_committed"))
                   == PER_PARTITION, job, log, 300, "partition 0 committed")
        wait_until(lambda: len(read_all(bootstrap, target, 1, "read_uncommitted")) > aborted,
                   job, log, 120, "partition 1 writing")
        assert len(read_all(bootstrap, target, 1, "read_uncommitted")) < aborted + PER_PARTITION
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(60)
    assert read_all(bootstrap, target, 1, "read_committed") == []
    second = [b"second-%d" % i for i in range(2 * PER_PARTITION)]
    produce(bootstrap, source, [(i % 2, None, v) for i, v in enumerate(second)])

    job = start_job(bootstrap, source, target, checkpoint, log, "--atomicity", "partition")
    run_to_end(job, log)
    got = [v for p in (0, 1) for v in read_all(bootstrap, target, p, "read_committed")]
    assert sorted(got) == sorted(first + second)


def batches(checkpoint: Path, topic: str) -> list[set[bytes]]:
    """The input values of each micro-batch planned so far, from the checkpoint's offset
    log (line 3 of ``offsets/N``: the end offsets of batch N; values are ``p-offset``)."""
    logs = sorted((int(f.name), f) for f in (checkpoint / "offsets").iterdir()
                  if f.name.isdigit())
    start: dict[str, int] = {}
    planned: list[set[bytes]] = []
    for _number, path in logs:
        end: dict[str, int] = json.loads(path.read_text().splitlines()[2])[topic]
        planned.append({b"%s-%d" % (p.encode(), offset) for p, stop in end.items()
                        for offset in range(start.get(p, 0), stop)})
        start = end
    return planned


def whole_batches(values: list[bytes], planned: list[set[bytes]]) -> int:
    """How many micro-batches ``values`` hold, checking that they hold the first ones
    whole, each record once, and nothing else."""
    assert len(values) == len(set(values)), "a record is visible twice"
    count, seen = 0, set[bytes]()
    while count < len(planned) and len(seen) < len(values):
        seen |= planned[count]
        count += 1
    assert set(values) == seen, (f"not whole batches: {len(values)} records, batch sizes "
                                 f"{[len(b) for b in planned]}")
    return count


def staging_topic_of(log: Path) -> str:
    """The default staging topic of the query the job's log names."""
    found = re.search(r"copy job: query ([0-9a-f-]+) started", log.read_text())
    assert found, log.read_text()[-3000:]
    return f"edgekafka-{found.group(1)}-staging"


@pytest.mark.timeout(1200)
def test_batch_atomicity_driver_killed_in_each_phase_shows_whole_batches_only(
        broker: BrokerProcess, topic_name: str, tmp_path: Path) -> None:
    bootstrap = broker.bootstrap
    source, target = topic_name, f"{topic_name}-out"
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, target, 2)
    produce(bootstrap, source, [(p, None, b"%d-%d" % (p, i))
                                for i in range(BATCH_INPUT) for p in (0, 1)])
    checkpoint, log = tmp_path / "checkpoint", tmp_path / "job.log"
    limit = ("--max-offsets", MAX_OFFSETS)

    # Run 1, killed in phase 1 of batch 1: batch 0 is committed, batch 1's tasks are
    # staging (partition 1's slowly), nothing of it is copied yet.
    job = start_job(bootstrap, source, target, checkpoint, log, *limit,
                    "--slow", BATCH_SLOW_SECONDS, "--slow-from", str(BATCH_ROWS))
    try:
        wait_until(lambda: (checkpoint / "offsets" / "0").exists(), job, log, 300,
                   "batch 0 planned")
        staging = staging_topic_of(log)
        batch_0 = len(batches(checkpoint, source)[0])
        wait_until(lambda: marker(bootstrap, staging.removesuffix("-staging"), staging) >= 1
                   and written(bootstrap, staging, 4) > batch_0,
                   job, log, 300, "batch 0 committed, batch 1 staging")
    finally:
        kill(job)
    planned = batches(checkpoint, source)
    committed = read_values(bootstrap, target, 2, "read_committed")
    assert whole_batches(committed, planned) == 1
    assert sorted(read_values(bootstrap, target, 2, "read_uncommitted")) == sorted(committed)
    assert planned[1] & set(read_values(bootstrap, staging, 4, "read_uncommitted"))

    # Run 2, killed in phase 2: the driver copies a batch slowly, in its open transaction.
    before = written(bootstrap, target, 2)
    job = start_job(bootstrap, source, target, checkpoint, log, *limit,
                    "--copy-pause-ms", COPY_PAUSE_MS)
    try:
        wait_until(lambda: written(bootstrap, target, 2) > before, job, log, 300,
                   "a copy under way")
    finally:
        kill(job)
    planned = batches(checkpoint, source)
    committed = read_values(bootstrap, target, 2, "read_committed")
    assert whole_batches(committed, planned) >= 1
    assert len(read_values(bootstrap, target, 2, "read_uncommitted")) > len(committed)

    second = [(p, None, b"%d-%d" % (p, i)) for i in range(BATCH_INPUT, BATCH_INPUT + 100)
              for p in (0, 1)]
    produce(bootstrap, source, second)
    run_to_end(start_job(bootstrap, source, target, checkpoint, log, *limit), log)
    got = read_values(bootstrap, target, 2, "read_committed")
    assert sorted(got) == sorted(b"%d-%d" % (p, i) for i in range(BATCH_INPUT + 100)
                                 for p in (0, 1))
