"""faust-streaming (a stream processor on aiokafka) against a real broker, on files and on
PostgreSQL: its
table lives in faust's in-memory store and in a changelog topic that faust creates with
``cleanup.policy=compact`` (and, from the app, small segments). Many updates to few keys
go through the app's source topic; the broker's log cleaner shrinks the changelog to
little more than the latest record of each key; a new worker with empty local state
restores every key's latest value from the compacted changelog (offsets sparse from 0)
before it reads its source topic again. Both of faust's processing guarantees run, each
on one engine (a faust worker's start and recovery cost the suite some 15 s):
``exactly_once``, on PostgreSQL, writes the changelog in transactions (a long one's commit
marker often lands in the open segment). The app is ``tests/faust_app.py``, run as its own
``python -m faust ... worker`` process."""

from __future__ import annotations

import itertools
import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import confluent_kafka
import kafka
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from tests.broker_process import BrokerProcess, ChildProcess
from tests.clients import create_topic
from tests.conftest import check_engine_left, engine_settings
from tests.faust_app import RECOVERED

KEYS = 8
ROUNDS = 100
TICK = "tick"
"""A key the test updates while it waits (see ``compacted``); not compared."""
CLEANER = {"logCleanerBackoffMs": "200", "logCleanerIoMaxBytesPerSecond": "0"}
START_TIMEOUT = 90.0
"""faust's start-up, group join and recovery, on a loaded 2-core machine."""


class FaustWorker(ChildProcess):
    """``python -m faust -A tests.faust_app worker``; ready once it printed its table as
    recovered from the changelog."""

    ready_pattern = re.compile(re.escape(RECOVERED) + r"(\{.*\})")
    what = "faust worker"

    def __init__(self, env: dict[str, str]) -> None:
        super().__init__()
        self.env = env
        self.recovered: dict[str, str] | None = None

    def start(self) -> FaustWorker:
        """Start the worker and wait until its table is recovered."""
        # --without-web: the command line's default turns the app's web_enabled=False
        # back on, and two workers (two tests at once) would both bind port 6066
        self.spawn([sys.executable, "-m", "faust", "-A", "tests.faust_app",
                    "worker", "--without-web", "--loglevel", "info"], START_TIMEOUT,
                   env=self.env)
        return self

    def on_ready(self, match: re.Match[str]) -> None:
        """Keep the first recovered table."""
        if self.recovered is None:
            self.recovered = json.loads(match[1])


@pytest.fixture
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker on the test's engine whose cleaner looks for work every 200 ms."""
    engine = str(request.param)
    process = BrokerProcess(tmp_path / "data", {**engine_settings(engine), **CLEANER}).start()
    yield process
    process.stop()
    check_engine_left(tmp_path / "data", engine)


@pytest.fixture
def workers() -> Iterator[list[FaustWorker]]:
    """Every faust worker a test starts; whatever is still running at the end is killed."""
    started: list[FaustWorker] = []
    yield started
    for worker in started:
        worker.kill()


def read_changelog(bootstrap: str, topic: str) -> list[tuple[int, bytes, bytes]]:
    """(offset, key, value) of every record in partition 0 of ``topic`` that a
    read_committed consumer (confluent-kafka's default) reads from offset 0 to the end."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"reader-{topic}",
        "enable.auto.commit": False, "enable.partition.eof": True,
    })
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0,
                                                        confluent_kafka.OFFSET_BEGINNING)])
        got: list[tuple[int, bytes, bytes]] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    return got
                raise AssertionError(f"reading {topic}: {error}")
            offset, key, value = msg.offset(), msg.key(), msg.value()
            assert offset is not None and key is not None and value is not None
            got.append((offset, key, value))
        raise AssertionError(f"{topic}: no end of partition after {len(got)} records")
    finally:
        consumer.close()


def latest_in(records: list[tuple[int, bytes, bytes]]) -> dict[str, str]:
    """Each key's latest value in changelog records (faust writes keys and values as
    JSON)."""
    return {json.loads(key): json.loads(value) for _, key, value in records}


def high_watermark(bootstrap: str, topic: str) -> int:
    """The end offset (high watermark) of partition 0 of ``topic``."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap,
                                         "group.id": f"watermarks-{topic}"})
    try:
        _, high = consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, 0), 10)
        return int(high)
    finally:
        consumer.close()


def wait_until(what: Callable[[], str], check: Callable[[], bool], timeout: float) -> None:
    """Call ``check`` until it holds; after ``timeout`` seconds fail with ``what()``."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting: {what()}")
        time.sleep(0.5)


def partition_sizes(bootstrap: str) -> dict[str, int]:
    """Bytes stored for partition 0 of every topic, by DescribeLogDirs."""
    admin = kafka.KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        [result] = admin.describe_log_dirs()
    finally:
        admin.close()
    return {t["name"]: p["partition_size"] for t in result["log_dirs"][0]["topics"]
            for p in t["partitions"] if p["partition_index"] == 0}


def topic_configs(bootstrap: str, topic: str) -> dict[str, str]:
    """``topic``'s configs, by DescribeConfigs."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entries = admin.describe_configs([resource])[resource].result(30)
    return {name: str(entry.value) for name, entry in entries.items()}


def produce_updates(bootstrap: str, source: str) -> dict[str, str]:
    """ROUNDS updates of each of KEYS keys to ``source``; return each key's last value."""
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    latest: dict[str, str] = {}
    for r in range(ROUNDS):
        for k in range(KEYS):
            latest[f"key-{k}"] = value = f"value-{r}-{k}-" + "." * 100
            producer.produce(source, key=f"key-{k}".encode(), value=value.encode())
        producer.poll(0)
    assert producer.flush(30) == 0
    return latest


def without_tick(table: dict[str, str]) -> dict[str, str]:
    """``table`` but the test's own ``TICK`` key."""
    return {key: value for key, value in table.items() if key != TICK}


@pytest.mark.parametrize(("broker", "guarantee"), [("file", "at_least_once"),
                                                   ("postgres", "exactly_once")],
                         indirect=["broker"])
def test_faust_restores_its_table_from_a_compacted_changelog(
        broker: BrokerProcess, workers: list[FaustWorker], tmp_path: Path,
        topic_name: str, guarantee: str) -> None:
    app_id = f"app-{topic_name}"
    changelog = f"{app_id}-latest-changelog"
    source = f"{topic_name}-source"
    create_topic(broker.bootstrap, source, partitions=1)
    env = {"FAUST_APP_BROKER": broker.bootstrap, "FAUST_APP_ID": app_id,
           "FAUST_APP_SOURCE": source, "FAUST_APP_GUARANTEE": guarantee}

    first = FaustWorker({**env, "FAUST_APP_DATADIR": str(tmp_path / "faust-1")})
    workers.append(first)
    first.start()
    assert first.recovered == {}
    configs = topic_configs(broker.bootstrap, changelog)  # faust's and the app's
    assert (configs["cleanup.policy"], configs["segment.bytes"]) == ("compact", "4096")

    expected = produce_updates(broker.bootstrap, source)
    written = KEYS * ROUNDS
    ticker = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap})
    ticks = itertools.count()
    records: list[tuple[int, bytes, bytes]] = []

    def compacted() -> bool:
        """Whether the app applied every update (each one a changelog record; with
        exactly_once, committed) and the cleaner left little more than one record per
        key (the open segment is never cleaned)."""
        nonlocal records
        # faust (0.15.3) commits a transaction without flushing the changelog writes it
        # buffered: the last ones wait in the next transaction until an event from the
        # source gets its offset committed. A tick is such an event.
        ticker.produce(source, key=TICK.encode(), value=str(next(ticks)).encode())
        ticker.flush(10)
        if high_watermark(broker.bootstrap, changelog) < written:
            return False
        records = read_changelog(broker.bootstrap, changelog)
        return without_tick(latest_in(records)) == expected and len(records) <= written // 4

    def state() -> str:
        return (f"changelog end offset {high_watermark(broker.bootstrap, changelog)}, "
                f"{written} updates, {len(records)} records, latest values "
                f"{'as' if without_tick(latest_in(records)) == expected else 'not as'} "
                f"expected, last records {records[-3:]}\n"
                + "\n".join(line for line in broker.lines if "cleaner" in line)
                + "\nfaust:\n" + "\n".join(first.lines[-30:]))

    wait_until(state, compacted, 90)
    offsets = [offset for offset, _, _ in records]
    assert offsets == sorted(set(offsets))  # in order, no duplicates
    assert offsets[0] > 0  # the oldest versions are gone; offsets start sparse
    sizes = partition_sizes(broker.bootstrap)  # the source took as many updates
    assert sizes[changelog] < sizes[source] / 2

    assert first.stop(60) == 0

    second = FaustWorker({**env, "FAUST_APP_DATADIR": str(tmp_path / "faust-2")})
    workers.append(second)
    second.start()
    assert second.recovered is not None
    assert without_tick(second.recovered) == expected
    assert second.stop(60) == 0
    assert len(read_changelog(broker.bootstrap, changelog)) <= written // 4
