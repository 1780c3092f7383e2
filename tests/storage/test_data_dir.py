"""The data directory belongs to one broker: a second broker started on it stops at once
with one line naming the directory and the owner's pid, and touches nothing in it; a start
that fails leaves no data directory it created behind (and keeps one that existed).

Real broker processes; real sockets.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from edge.app import BrokerApp, StartupError
from edge.config import load_config
from tests.broker_process import REPO, BrokerProcess
from tests.clients import consume_confluent, create_topic, make_records, produce_confluent


def _run_broker(data_dir: Path, listener: str = "PLAINTEXT://127.0.0.1:0"
                ) -> subprocess.CompletedProcess[str]:
    """Run a broker that is expected to stop by itself."""
    return subprocess.run(
        [sys.executable, "-m", "edge.cli", "--set", f"kafkaListeners={listener}",
         "--set", f"dataDir={data_dir}"],
        cwd=REPO, capture_output=True, text=True, timeout=60)


def _files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and modification time."""
    found = {}
    for path in root.rglob("*"):
        if path.is_file():
            stat = path.stat()
            found[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns)
    return found


def test_a_second_broker_on_a_running_brokers_data_directory_stops_at_once(
        tmp_path: Path, topic_name: str) -> None:
    data = tmp_path / "data"
    first = BrokerProcess(data).start()
    try:
        create_topic(first.bootstrap, topic_name)
        before = make_records(30, 1_700_000_000_000)
        produce_confluent(first.bootstrap, topic_name, before, "none")
        files = _files(data)
        assert first.proc is not None

        second = _run_broker(data)

        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert str(data) in lines[0] and f"pid {first.proc.pid}" in lines[0], lines[0]
        assert _files(data) == files  # the loser wrote, truncated and removed nothing
        # the first broker keeps serving, and nothing it acknowledged is lost
        after = make_records(60, 1_700_000_100_000)[30:]
        produce_confluent(first.bootstrap, topic_name, after, "none")
        assert len(consume_confluent(first.bootstrap, topic_name, 60)) == 60
        assert first.stop() == 0
        first.start()
        got = consume_confluent(first.bootstrap, topic_name, 60)
        assert sorted((g.rec.key, g.rec.value) for g in got) == \
            sorted((r.key, r.value) for r in before + after)
    finally:
        first.kill()


def test_a_failed_start_removes_the_data_directory_it_created(tmp_path: Path) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        listener = f"PLAINTEXT://127.0.0.1:{busy.getsockname()[1]}"
        created = tmp_path / "new" / "nested" / "data"
        result = _run_broker(created, listener)
        assert result.returncode != 0
        assert not (tmp_path / "new").exists()  # the whole chain it made, and only that
        assert tmp_path.exists()

        existing = tmp_path / "existing"
        existing.mkdir()
        (existing / "operator-notes.txt").write_text("keep me\n")
        result = _run_broker(existing, listener)
        assert result.returncode != 0
        assert (existing / "operator-notes.txt").read_text() == "keep me\n"
    finally:
        busy.close()


def test_the_lock_goes_with_the_process(tmp_path: Path) -> None:
    """kill -9 leaves the lock file, not the lock: the next broker starts."""
    data = tmp_path / "data"
    broker = BrokerProcess(data).start()
    broker.kill()
    assert (data / ".lock").exists()
    broker.start()
    assert broker.proc is not None
    assert (data / ".lock").read_text().strip() == str(broker.proc.pid)
    assert broker.stop() == 0
    assert os.path.exists(data)


def test_a_failed_start_removes_its_data_directory_before_releasing_it(
        tmp_path: Path) -> None:
    """The directory goes while the lock is still held: once ``start`` has failed (and
    released the lock) there is nothing left that another broker could have taken."""
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    created = tmp_path / "new" / "data"
    config = load_config(None, [f"dataDir={created}",
                                f"kafkaListeners=PLAINTEXT://127.0.0.1:{busy.getsockname()[1]}"])

    async def start() -> None:
        app = BrokerApp(config)
        assert (created / ".lock").exists()
        with pytest.raises(StartupError):
            await app.start()

    try:
        asyncio.run(start())
    finally:
        busy.close()
    assert not (tmp_path / "new").exists()
    assert tmp_path.exists()
