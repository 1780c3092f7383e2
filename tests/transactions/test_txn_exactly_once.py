"""Transactions acceptance 2: a consume-transform-produce loop (confluent-kafka, a group
consumer with read_committed, offsets sent with send_offsets_to_transaction) moves 20,000
records from one topic to another exactly once although its process is killed (SIGKILL)
and restarted twice mid-way."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from tests.broker_process import REPO, BrokerProcess
from tests.clients import create_topic
from tests.txn_helpers import (
    READ_COMMITTED,
    TxnConnection,
    end_offsets,
    produce_plain,
    read_all,
    start_broker,
)

PARTITIONS = 4
RECORDS = 20_000


class Worker:
    """One run of the worker process, with its progress read from its stdout."""

    def __init__(self, broker: BrokerProcess, source: str, sink: str, group: str,
                 tid: str, pause_at: int = -1) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.txn_helpers", "eos", broker.bootstrap, source, sink,
             group, tid, "250", str(pause_at)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.committed = 0
        self.open = -1
        self.lines: list[str] = []
        self.errors: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())
            if line.startswith("committed "):
                self.committed = int(line.split()[1])
            elif line.startswith("open "):
                self.open = int(line.split()[1])

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if not line.startswith("%"):
                self.errors.append(line.rstrip())

    def wait_for(self, committed: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.committed < committed:
            assert self.proc.poll() is None, f"worker died: {self.errors[-20:]}"
            assert time.monotonic() < deadline, \
                f"worker stuck at {self.committed} committed: {self.lines[-3:]} {self.errors[-20:]}"
            time.sleep(0.01)

    def wait_open(self, timeout: float) -> None:
        """Wait until a transaction has written its records but not committed."""
        deadline = time.monotonic() + timeout
        while self.open < 0:
            assert self.proc.poll() is None, f"worker died: {self.errors[-20:]}"
            assert time.monotonic() < deadline, "no open transaction seen"
            time.sleep(0.0005)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def _committed(broker: BrokerProcess, group: str, topic: str) -> int:
    """Records the group has committed on ``topic``, all partitions together."""
    conn = TxnConnection(broker.port)
    try:
        return sum(max(0, offset) for offset in
                   conn.offset_fetch(group, topic, range(PARTITIONS)).values())
    finally:
        conn.close()


def test_consume_transform_produce_exactly_once_across_kills(tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "data")
    source, sink, group, tid = "eos-in", "eos-out", "eos-group", "eos-tid"
    workers: list[Worker] = []
    try:
        create_topic(broker.bootstrap, source, PARTITIONS)
        create_topic(broker.bootstrap, sink, PARTITIONS)
        produce_plain(broker.bootstrap, source,
                      [(i % PARTITIONS, f"rec-{i}".encode()) for i in range(RECORDS)])
        input_ends = end_offsets(broker.bootstrap, source, PARTITIONS, READ_COMMITTED)
        assert sum(input_ends.values()) == RECORDS

        total = 0
        starts: list[int] = []  # the group's committed records when each run began
        for stop_after, in_txn in ((4000, True), (7000, False), (None, False)):
            starts.append(_committed(broker, group, source))
            worker = Worker(broker, source, sink, group, tid,
                            stop_after if in_txn and stop_after is not None else -1)
            workers.append(worker)
            if stop_after is None:
                break
            worker.wait_for(stop_after, 60)
            if in_txn:
                worker.wait_open(30)  # records written, offsets and commit still to come
                assert worker.open == worker.committed
            else:
                time.sleep(0.013)  # somewhere in the loop
            worker.kill()  # SIGKILL
            total += worker.committed

        conn = TxnConnection(broker.port)
        try:
            deadline = time.monotonic() + 60
            while conn.offset_fetch(group, source, range(PARTITIONS)) != input_ends:
                assert workers[-1].proc.poll() is None, workers[-1].errors[-20:]
                assert time.monotonic() < deadline, (
                    conn.offset_fetch(group, source, range(PARTITIONS)), input_ends,
                    workers[-1].lines[-3:], workers[-1].errors[-20:])
                time.sleep(0.1)
            # the offsets are visible as the commit completes, a moment before the worker
            # prints it: wait for that line
            workers[-1].wait_for(RECORDS - starts[-1], 30)
            workers[-1].kill()
            assert conn.offset_fetch(group, source, range(PARTITIONS)) == input_ends
        finally:
            conn.close()

        out = read_all(broker.bootstrap, sink, PARTITIONS, "read_committed", timeout=60)
        got = Counter(v for _, _, v in out)
        want = Counter(b"out:rec-%d" % i for i in range(RECORDS))
        missing = want - got
        extra = got - want
        assert not missing and not extra, (
            f"{sum(missing.values())} missing (e.g. {list(missing)[:5]}), "
            f"{sum(extra.values())} duplicated/extra (e.g. {list(extra)[:5]}); "
            f"first runs committed {total}")
        # and the uncommitted view holds the killed runs' aborted leftovers, if any
        raw = read_all(broker.bootstrap, sink, PARTITIONS, "read_uncommitted", timeout=60)
        assert len(raw) > RECORDS  # the first kill left an open transaction behind
        # each run went on from the previous run's committed offsets. (A killed run's
        # last commit can land without its line printed, so the group's offsets, not the
        # lines, say where the next run began.)
        runs = [w.committed for w in workers]
        assert starts[0] == 0 and starts[1] == runs[0] == 4000, (starts, runs)
        assert starts[2] >= starts[1] + 7000, (starts, runs)
        assert runs[-1] == RECORDS - starts[2] < RECORDS - 8000, (starts, runs)
        print("committed per run:", runs, "runs began at:", starts,
              "uncommitted view:", len(raw))
    finally:
        for worker in workers:
            if worker.proc.poll() is None:
                worker.kill()
        broker.stop()
