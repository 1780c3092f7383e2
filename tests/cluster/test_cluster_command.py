"""``edge-broker cluster``: a throwaway PostgreSQL and brokers on it, served until SIGINT,
then everything stopped and removed; a broker that cannot start stops everything; a broker
that dies is reported while the others serve; a kept ``--data-dir`` starts again with its
data. Real processes, a real PostgreSQL and a real client (confluent-kafka)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from broker_core.storage.pg_schema import SCHEMA_VERSION
from edge.local_postgres import THROWAWAY_ROOT, LocalPostgres
from tests.broker_process import REPO
from tests.clients import Rec, consume_confluent, create_topic, make_records, produce_confluent
from tests.cluster_process import ClusterProcess, gone
from tests.group_helpers import wait_until
from tests.ports import free_port


def refused(address: str) -> bool:
    """Whether nothing listens at ``host:port`` any more."""
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError:
        return True
    return False


def postgres_gone(port: int) -> bool:
    """Whether no PostgreSQL answers on 127.0.0.1:``port``."""
    try:
        psycopg.connect(f"postgres://edge@127.0.0.1:{port}/postgres", connect_timeout=5).close()
    except psycopg.OperationalError:
        return True
    return False


def round_trip(bootstrap: str, topic: str, records: list[Rec]) -> None:
    """Produce ``records`` to a new topic and read them back at continuous offsets."""
    create_topic(bootstrap, topic)
    produce_confluent(bootstrap, topic, records, "none")
    check_records(bootstrap, topic, records)


def check_records(bootstrap: str, topic: str, records: list[Rec]) -> None:
    """The topic holds exactly ``records``, at offsets 0, 1, ... of each partition."""
    got = consume_confluent(bootstrap, topic, len(records))
    assert sorted((g.partition, g.rec.value) for g in got) == sorted(
        (r.partition, r.value) for r in records)
    for partition in {r.partition for r in records}:
        offsets = sorted(g.offset for g in got if g.partition == partition)
        assert offsets == list(range(len(offsets)))


def test_a_cluster_serves_until_sigint_then_everything_is_gone(topic_name: str) -> None:
    cluster = ClusterProcess("--brokers", "3", "--base-port", "0").start()
    try:
        assert len(cluster.bootstrap) == len(set(cluster.bootstrap)) == 3, cluster.bootstrap
        brokers = cluster.broker_pids()
        assert sorted(brokers) == [0, 1, 2]
        pg_port, pg_pid, pg_dir = cluster.postgres()
        assert pg_dir.is_relative_to(THROWAWAY_ROOT) and (pg_dir / "data").is_dir()
        assert not any(refused(address) for address in cluster.bootstrap)
        round_trip(cluster.bootstrap[0], topic_name, make_records(30, 1_700_000_000_000))
        assert cluster.proc is not None
        cluster.proc.send_signal(signal.SIGINT)
        assert cluster.proc.wait(60) == 0, cluster.log_text()
    finally:
        cluster.kill()
    assert all(gone(pid) for pid in brokers.values()), cluster.log_text()
    assert all(refused(address) for address in cluster.bootstrap)
    assert gone(pg_pid) and postgres_gone(pg_port)
    assert not pg_dir.exists()


def test_a_bad_setting_stops_the_command_before_anything_starts() -> None:
    cluster = ClusterProcess("--brokers", "2", "--set", "noSuchKey=1")
    assert cluster.run() == 2
    assert len(cluster.lines) == 1, cluster.log_text()
    assert cluster.lines[0].startswith("edge-broker cluster: configuration error: ")
    assert "noSuchKey" in cluster.lines[0]
    assert cluster.bootstrap == []


def test_a_broker_that_cannot_start_stops_everything() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        port = int(taken.getsockname()[1])
        cluster = ClusterProcess("--brokers", "3", "--base-port", str(port))
        assert cluster.run() == 1
    log = cluster.log_text()
    assert cluster.bootstrap == []  # never ready
    assert f"cannot listen on PLAINTEXT://127.0.0.1:{port}" in log
    assert "edge-broker cluster: broker 0 exited with code 2 before it was ready; stopping" \
        in cluster.lines, log
    assert "does not exist" not in log  # its peers kept their tables (see below)
    assert cluster.lines[-1] == "edge-broker cluster: stopped"
    assert all(gone(pid) for pid in cluster.broker_pids().values()), log
    pg_port, pg_pid, pg_dir = cluster.postgres()
    assert gone(pg_pid) and postgres_gone(pg_port)
    assert not pg_dir.exists()


def test_a_broker_that_cannot_start_leaves_the_schema_to_its_peers(data_dir: Path) -> None:
    """The command migrates the schema before the brokers start: a broker that created it
    would drop it again when its own start failed, under the other brokers."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        port = int(taken.getsockname()[1])
        cluster = ClusterProcess("--brokers", "1", "--base-port", str(port),
                                 "--data-dir", str(data_dir))
        assert cluster.run() == 1
    assert f"cannot listen on PLAINTEXT://127.0.0.1:{port}" in cluster.log_text()
    server = LocalPostgres(data_dir).start()
    try:
        with psycopg.connect(server.url("edge")) as conn:
            assert conn.execute("SELECT version FROM edge_schema_version").fetchone() == (
                SCHEMA_VERSION,)
    finally:
        server.stop()


def test_a_broker_that_dies_is_reported_and_the_others_serve_on(topic_name: str) -> None:
    cluster = ClusterProcess("--brokers", "2", "--base-port", "0").start()
    try:
        victim = cluster.broker_pids()[1]
        mark = len(cluster.lines)
        subprocess.run(["kill", "-9", str(victim)], check=True)
        cluster.wait_for_log(r"edge-broker cluster: broker 1 exited unexpectedly with code -9; "
                             r"1 still running", 30, mark)
        round_trip(cluster.bootstrap[0], topic_name, make_records(10, 1_700_000_000_000))
        assert cluster.proc is not None
        cluster.proc.send_signal(signal.SIGTERM)
        assert cluster.proc.wait(60) == 1  # a broker did not stop cleanly: it died
    finally:
        cluster.kill()
    assert not cluster.postgres()[2].exists()


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A directory for PostgreSQL that its user (``postgres``, when tests run as root) can
    reach: pytest's ``tmp_path`` is inside a directory only its owner may enter."""
    path = Path(tempfile.mkdtemp(prefix="edge-cluster-test-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_kept_data_dir_survives_a_killed_command_and_starts_again(data_dir: Path,
                                                                    topic_name: str) -> None:
    records = make_records(12, 1_700_000_000_000)
    first = ClusterProcess("--brokers", "2", "--base-port", "0",
                           "--data-dir", str(data_dir)).start()
    try:
        round_trip(first.bootstrap[0], topic_name, records)
        pg_pid = first.postgres()[1]
        brokers = first.broker_pids()
    finally:
        first.kill()  # kill -9: no cleanup by the command itself
    wait_until(lambda: all(gone(pid) for pid in brokers.values()), 60,
               "the brokers of a killed cluster to exit")
    assert not gone(pg_pid)  # left running in the kept directory
    second = ClusterProcess("--brokers", "2", "--base-port", "0",
                            "--data-dir", str(data_dir)).start()
    assert second.proc is not None
    try:
        assert gone(pg_pid)  # the server left behind was stopped first
        assert "stopping the PostgreSQL server left running" in second.log_text()
        third = ClusterProcess("--brokers", "1", "--base-port", "0", "--data-dir", str(data_dir))
        assert third.run() == 1  # the directory is the running cluster's
        assert f"{data_dir} is in use by another edge-broker cluster " \
               f"(pid {second.proc.pid})" in third.log_text()
        check_records(second.bootstrap[1], topic_name, records)
        second.proc.send_signal(signal.SIGINT)
        assert second.proc.wait(60) == 0, second.log_text()
    finally:
        second.kill()
    pg_port, pg_pid, pg_dir = second.postgres()
    assert pg_dir == data_dir and (data_dir / "data" / "PG_VERSION").exists()
    assert gone(pg_pid) and postgres_gone(pg_port)


def test_make_cluster_runs_the_command(tmp_path: Path, topic_name: str) -> None:
    log = tmp_path / "make.log"
    with log.open("w") as stderr:
        make = subprocess.Popen(
            ["make", "--no-print-directory", "cluster", "ARGS=--brokers 1 --base-port 0"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, text=True,
            start_new_session=True)
    assert make.stdout is not None
    try:
        lines = [make.stdout.readline() for _ in range(2)]  # the recipe, then the bootstrap
        assert lines[0].split()[1:] == ["cluster", "--brokers", "1", "--base-port", "0"]
        bootstrap = lines[1].strip()
        assert re.fullmatch(r"127\.0\.0\.1:\d+", bootstrap), log.read_text()
        round_trip(bootstrap, topic_name, make_records(6, 1_700_000_000_000))
        os.killpg(make.pid, signal.SIGINT)  # Ctrl-C in the terminal: make and the command
        make.wait(60)
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait(30)
    assert "edge-broker cluster: stopped" in log.read_text().splitlines()
    assert refused(bootstrap)
