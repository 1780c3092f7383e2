"""Kafka Connect 4.3 in distributed mode against the broker: real ``ConnectDistributed``
JVMs with the README's worker properties, the FileStream connectors (a file of lines to a
topic, the topic to a file) created through the REST API.

Two workers in one Connect group (the sessioned protocol, incremental cooperative
rebalancing) share the connectors' tasks; a worker stopped with SIGTERM hands them over
without a duplicate, and one killed with -9 hands them over at least once, its source
task resuming from the source offsets committed to the offsets topic and its sink from
the consumer group's committed offsets. A worker with exactly-once source support (KIP-618:
transactional source tasks, zombie fencing through the admin client's fenceProducers, the
leader writing task configs to the config topic in transactions) killed with -9 and
started again leaves every line once in the topic for a read_committed reader."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest

from tests.broker_process import BrokerProcess
from tests.connect_worker import ConnectWorker, Placement, write_worker_properties
from tests.java_client import connect_classpath
from tests.txn_helpers import read_all

SOURCE = "org.apache.kafka.connect.file.FileStreamSourceConnector"
SINK = "org.apache.kafka.connect.file.FileStreamSinkConnector"
T = TypeVar("T")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """The module's broker: a group's first join not held back (Kafka's own Connect tests
    set group.initial.rebalance.delay.ms=0 too) and a timed-out transaction aborted within
    a second (see ``TEST_SETTINGS``)."""
    process = BrokerProcess(tmp_path_factory.mktemp("broker-data"), {
        "groupInitialRebalanceDelayMs": "0",
        "transactionAbortTimedOutTransactionsIntervalMs": "1000"}).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    return connect_classpath(tmp_path_factory.mktemp("connect-classes"))


@pytest.fixture(scope="module")
def pair(broker: BrokerProcess, classpath: str,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ConnectWorker]]:
    """Two workers of the Connect group ``connect-pair``, started together."""
    properties = write_worker_properties(
        tmp_path_factory.mktemp("connect-pair") / "worker.properties", broker.bootstrap,
        "connect-pair", exactly_once=False)
    workers = [ConnectWorker(classpath, properties) for _ in range(2)]
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(ConnectWorker.start, workers))
        for worker in workers:
            worker.wait_joined()
        yield workers
    finally:
        for worker in workers:
            worker.kill()


@pytest.fixture(scope="module")
def exactly_once_worker(broker: BrokerProcess, classpath: str,
                        tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectWorker]:
    """One worker of the Connect group ``connect-eos``, with exactly-once source support."""
    properties = write_worker_properties(
        tmp_path_factory.mktemp("connect-eos") / "worker.properties", broker.bootstrap,
        "connect-eos", exactly_once=True)
    worker = ConnectWorker(classpath, properties)
    try:
        worker.start().wait_joined()
        yield worker
    finally:
        worker.kill()


def eventually(probe: Callable[[], T | None], what: str, timeout: float = 90.0) -> T:
    """The first result of ``probe`` that is not None, polled until ``timeout``."""
    deadline = time.monotonic() + timeout
    while (result := probe()) is None:
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return result


def append_lines(path: Path, prefix: str, start: int, stop: int) -> list[str]:
    """Append lines ``prefix-start`` .. ``prefix-(stop - 1)`` to ``path``; the lines."""
    lines = [f"{prefix}-{i}" for i in range(start, stop)]
    with path.open("a") as file:
        file.write("".join(f"{line}\n" for line in lines))
    return lines


def lines_of(path: Path) -> list[str]:
    """The complete lines of ``path`` (none before the sink created it)."""
    text = path.read_text() if path.exists() else ""
    return text[:text.rfind("\n") + 1].splitlines()


def first_copies(lines: list[str]) -> list[str]:
    """``lines`` without the repeats of a line already seen."""
    return list(dict.fromkeys(lines))


def delivered(path: Path, sent: list[str]) -> list[str] | None:
    """The sink file's lines once it holds a copy of every line of ``sent``."""
    lines = lines_of(path)
    return lines if len(first_copies(lines)) >= len(sent) else None


def file_connectors(worker: ConnectWorker, name: str, source_file: Path, sink_file: Path,
                    topic: str, source: dict[str, str] | None = None,
                    sink: dict[str, str] | None = None) -> None:
    """A FileStreamSource connector ``name-source`` of ``source_file`` into ``topic``, and
    a FileStreamSink ``name-sink`` of ``topic`` into ``sink_file``."""
    worker.put_connector(f"{name}-source", {
        "connector.class": SOURCE, "file": str(source_file), "topic": topic,
        "tasks.max": "1", **(source or {})})
    worker.put_connector(f"{name}-sink", {
        "connector.class": SINK, "file": str(sink_file), "topics": topic,
        "tasks.max": "1", **(sink or {})})


def running(worker: ConnectWorker, *workers: ConnectWorker) -> dict[str, Placement] | None:
    """The placements (asked of ``worker``) once every connector and task runs, on
    ``workers`` only and with a task on each."""
    placements = worker.placements()
    ids = {w.worker_id for w in workers}
    if all(p.state == "RUNNING" and p.worker in ids and p.tasks
           and set(p.task_states) == {"RUNNING"} and set(p.tasks.values()) <= ids
           for p in placements.values()) \
            and {w for p in placements.values() for w in p.tasks.values()} == ids:
        return placements
    return None


def holder(workers: list[ConnectWorker], placements: dict[str, Placement],
           connector: str) -> ConnectWorker:
    """The worker that runs task 0 of ``connector``."""
    [worker] = [w for w in workers if w.worker_id == placements[connector].tasks[0]]
    return worker


def test_tasks_spread_and_move_at_least_once(pair: list[ConnectWorker],
                                             tmp_path: Path) -> None:
    source_file, sink_file = tmp_path / "lines.txt", tmp_path / "copy.txt"
    sent = append_lines(source_file, "line", 0, 200)
    first, second = pair
    file_connectors(first, "pair", source_file, sink_file, "connect-pair-lines")
    assert eventually(lambda: delivered(sink_file, sent), "the first lines") == sent
    # one task on each worker (the two connectors' tasks are spread)
    placements = eventually(lambda: running(first, first, second), "tasks on both workers")

    # SIGTERM: the sink's worker commits its consumer's offsets and leaves; the other
    # worker takes the task over and goes on from them, no line twice
    stopped = holder(pair, placements, "pair-sink")
    [survivor] = [w for w in pair if w is not stopped]
    assert stopped.stop() == 143  # 128 + SIGTERM
    sent += append_lines(source_file, "line", 200, 400)
    eventually(lambda: running(survivor, survivor), "every task on the other worker")
    assert eventually(lambda: delivered(sink_file, sent), "the lines after SIGTERM") == sent

    # the stopped worker starts again and takes a task back; then the source task's
    # worker is killed with -9 in the middle of a file and its task moves: every line
    # arrives, in order, the ones after its last committed source offset twice
    stopped.start().wait_joined()
    placements = eventually(lambda: running(survivor, stopped, survivor),
                            "tasks on both workers again")
    killed = holder(pair, placements, "pair-source")
    [survivor] = [w for w in pair if w is not killed]
    sent += append_lines(source_file, "line", 400, 20_400)
    eventually(lambda: len(lines_of(sink_file)) >= 1_000 or None, "lines on their way")
    killed.kill()
    sent += append_lines(source_file, "line", 20_400, 20_500)
    eventually(lambda: running(survivor, survivor), "every task on the survivor")
    lines = eventually(lambda: delivered(sink_file, sent), "the lines after kill -9")
    assert first_copies(lines) == sent
    repeated = len(lines) - len(sent)
    # resumed from the committed offsets, not from the file's start
    assert set(lines[:400]) == set(sent[:400]) and lines.count("line-399") == 1
    print(f"kill -9 of the source task's worker: {repeated} lines delivered twice")


def test_exactly_once_source_after_kill(exactly_once_worker: ConnectWorker,
                                        broker: BrokerProcess, tmp_path: Path) -> None:
    worker = exactly_once_worker
    source_file, sink_file = tmp_path / "lines.txt", tmp_path / "copy.txt"
    topic = "connect-eos-lines"
    sent = append_lines(source_file, "eos", 0, 200)
    file_connectors(worker, "eos", source_file, sink_file, topic,
                    source={"exactly.once.support": "required"},
                    sink={"consumer.override.isolation.level": "read_committed"})
    assert eventually(lambda: delivered(sink_file, sent), "the first lines") == sent

    # kill -9 while the source task's transactions run; the worker started again fences
    # the old task's producer and goes on from the offsets committed in its transactions
    sent += append_lines(source_file, "eos", 200, 20_200)
    eventually(lambda: len(lines_of(sink_file)) >= 1_000 or None, "lines on their way")
    worker.kill()
    sent += append_lines(source_file, "eos", 20_200, 20_300)
    worker.start().wait_joined()
    eventually(lambda: running(worker, worker), "the connectors running again")
    lines = eventually(lambda: delivered(sink_file, sent), "the lines after kill -9")
    assert first_copies(lines) == sent  # the sink itself is at least once
    committed = [value.decode() for _p, _o, value in
                 read_all(broker.bootstrap, topic, 1, "read_committed")]
    assert committed == sent  # each line once in the topic
