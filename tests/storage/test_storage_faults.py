"""Write faults are logged once per cause, a cause being a kind of write and its errno: a
kind failing again and again while another kind succeeds logs one ERROR line, not an
ERROR and an INFO line each time. The errors are real: writes to ``/dev/full``."""

from __future__ import annotations

import errno
import logging

import pytest

from broker_core.errors import ErrorCode
from broker_core.storage import LogOffline
from broker_core.storage_faults import WriteFaults, WriteKind

LOGGER = "broker_core.storage_faults"


def enospc() -> OSError:
    """The error the kernel gives a write to a full device."""
    with open("/dev/full", "wb", buffering=0) as full:
        try:
            full.write(b"x")
        except OSError as exc:
            return exc
    raise AssertionError("/dev/full took a write")


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == LOGGER]


def test_a_kind_failing_while_another_succeeds_logs_its_cause_once(
        caplog: pytest.LogCaptureFixture) -> None:
    faults = WriteFaults()
    caplog.set_level(logging.INFO, logger=LOGGER)
    for _ in range(3):  # snapshots fail every round while appends succeed
        error = faults.failed(enospc(), "the producer snapshot of t-0", WriteKind.SNAPSHOTS)
        assert error.code == ErrorCode.KAFKA_STORAGE_ERROR
        faults.succeeded(WriteKind.RECORDS)
    assert [level for level, _ in lines(caplog)] == ["ERROR"], lines(caplog)
    assert "producer snapshots are answered" in lines(caplog)[0][1]

    # another kind meeting the same errno is a cause of its own
    faults.failed(enospc(), "t-0", WriteKind.RECORDS, ErrorCode.NOT_COORDINATOR)
    faults.failed(enospc(), "t-1", WriteKind.RECORDS)
    assert [level for level, _ in lines(caplog)] == ["ERROR", "ERROR"]
    # each kind recovers on its own, once
    faults.succeeded(WriteKind.SNAPSHOTS)
    faults.succeeded(WriteKind.SNAPSHOTS)
    faults.succeeded(WriteKind.RECORDS)
    assert lines(caplog)[2:] == [
        ("INFO", "storage: producer snapshots succeed again (3 failed meanwhile)"),
        ("INFO", "storage: record appends succeed again (2 failed meanwhile)")]


def test_an_offline_partition_is_not_logged_again(caplog: pytest.LogCaptureFixture) -> None:
    """A partition taken offline logged that itself; answering its writes adds nothing."""
    faults = WriteFaults()
    caplog.set_level(logging.INFO, logger=LOGGER)
    offline = LogOffline(errno.EIO, "partition log t/0 is offline until restart")
    assert faults.failed(offline, "t-0", WriteKind.RECORDS).code == \
        ErrorCode.KAFKA_STORAGE_ERROR
    faults.succeeded(WriteKind.RECORDS)
    assert lines(caplog) == []
