"""AlterClientQuotas rewrites the whole quotas document (``quotas.json`` in the data
directory: a file written and fsynced) in a worker thread, the changes one at a time in
the order asked. While a write is held up, the broker serves every other connection
(ApiVersions; DescribeClientQuotas answered with what is stored); a change asked behind it
is stored after it; a write that fails closes its connection, as it always did (the
client retries); concurrent changes of many connections are all kept; a restart reads
the last change. Raw requests against a real broker on files; a write is held up by
making its temporary file a FIFO whose pipe holds less than the document."""

from __future__ import annotations

import fcntl
import os
import struct
import termios
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from broker_core.quotas.store import KEY
from broker_core.storage.fsutil import TEMP_SUFFIX
from tests.broker_process import BrokerProcess
from tests.quota_helpers import alter, describe, parts
from tests.raw import RawConnection

P = "producer_byte_rate"
EXACT = 0
NAMES = [f"user-{i:02d}-" + "x" * 200 for i in range(40)]
"""Users whose quotas make a document larger than the smallest pipe (one page)."""


@pytest.fixture()
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path / "data").start()
    try:
        yield process
    finally:
        process.stop(30)


def _value(conn: RawConnection, user: str) -> float | None:
    error, found = describe(conn, [("user", EXACT, user)])
    assert error == 0
    return found.get(parts({"user": user}), {}).get(P)


def _hold(path: Path) -> int:
    """Make ``path`` a FIFO whose pipe holds one page, opened for reading (so a writer's
    open returns at once and its write stops once the page is full); its read end."""
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    fcntl.fcntl(reader, fcntl.F_SETPIPE_SZ, 4096)
    return reader


def _until_full(reader: int) -> None:
    """Wait until a writer has filled the pipe (it is held in its write)."""
    size = fcntl.fcntl(reader, fcntl.F_GETPIPE_SZ)
    deadline = time.monotonic() + 30
    while struct.unpack("i", fcntl.ioctl(reader, termios.FIONREAD, b"\0\0\0\0"))[0] < size:
        assert time.monotonic() < deadline, "the write did not reach the held file"
        time.sleep(0.01)


def _release(reader: int) -> None:
    """Read the FIFO until its writer closes it."""
    os.set_blocking(reader, True)
    while os.read(reader, 65536):
        pass
    os.close(reader)


def test_a_held_quota_write_holds_nobody_else_and_the_last_change_is_stored(
        broker: BrokerProcess) -> None:
    conn = RawConnection(broker.port)
    assert alter(conn, [({"user": name}, {P: 1000.0}) for name in NAMES]) == \
        [(0, None)] * len(NAMES)
    user = NAMES[0]
    reader = _hold(broker.data_dir / (KEY + TEMP_SUFFIX))
    released = False
    with ThreadPoolExecutor(2) as pool:
        try:
            held = pool.submit(alter, RawConnection(broker.port, timeout=60),
                               [({"user": user}, {P: 2000.0})])
            _until_full(reader)
            # the write is held up in the broker's worker thread; the event loop serves on
            other = RawConnection(broker.port)
            versions = other.call(ApiVersionsRequest[3](client_software_name="t",
                                                        client_software_version="1"), 3,
                                  ApiVersionsResponse)
            assert versions.error_code == 0
            assert _value(other, user) == 1000.0  # what is stored
            behind = pool.submit(alter, RawConnection(broker.port, timeout=60),
                                 [({"user": user}, {P: 3000.0})])
            _release(reader)
            released = True
        finally:
            if not released:
                _release(reader)
        # a FIFO cannot be fsynced: that write failed, and closed its connection as any
        # failed quota write does; the change behind it was stored
        with pytest.raises(ConnectionError):
            held.result(60)
        assert behind.result(60) == [(0, None)]
    assert _value(conn, user) == 3000.0
    assert broker.stop(30) == 0
    broker.start()
    conn = RawConnection(broker.port)
    assert _value(conn, user) == 3000.0
    assert _value(conn, NAMES[1]) == 1000.0


def test_concurrent_changes_all_end_on_disk(broker: BrokerProcess) -> None:
    """Eight connections change quotas at once, each its own user ten times: every user
    ends with its last value, in memory and after a restart."""

    def changes(name: str) -> list[list[tuple[int, str | None]]]:
        conn = RawConnection(broker.port, timeout=60)
        return [alter(conn, [({"user": name}, {P: float(value)})]) for value in range(1, 11)]

    users = NAMES[:8]
    with ThreadPoolExecutor(len(users)) as pool:
        for answers in pool.map(changes, users):
            assert answers == [[(0, None)]] * 10
    conn = RawConnection(broker.port)
    assert [_value(conn, name) for name in users] == [10.0] * len(users)
    assert broker.stop(30) == 0
    broker.start()
    conn = RawConnection(broker.port)
    assert [_value(conn, name) for name in users] == [10.0] * len(users)
