"""The data directory lock: one broker per directory, as Kafka's ``.lock``.

The owner holds ``fcntl.flock`` on ``<dir>/.lock`` for as long as it runs (the kernel
drops it when the process dies, even by ``kill -9``) and writes its pid into the file so
that a second broker can name it. A broker that finds the lock taken touches nothing in
the directory: it opens the lock file (never truncating it), fails to lock it, and stops.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from .errors import StorageError

LOCK_FILE = ".lock"
_PID_BYTES = 32


class DataDirLocked(StorageError):
    """Another process holds the data directory's lock."""

    def __init__(self, directory: Path, owner: int | None) -> None:
        holder = f"pid {owner}" if owner is not None else "a process whose pid is unknown"
        super().__init__(f"data directory {directory} is in use by another broker ({holder})")
        self.directory = directory
        self.owner = owner


class DataDirLock:
    """An exclusive lock on a data directory, held until :meth:`release`."""

    def __init__(self, directory: Path) -> None:
        """Lock ``directory`` (which must exist); DataDirLocked when another process has it."""
        self.directory = directory
        path = directory / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_pid(fd)
            os.close(fd)
            raise DataDirLocked(directory, owner) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd
        # a full disk: the lock holds all the same, only the pid is missing
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        """Give the directory up (idempotent)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)  # closing the last descriptor drops the flock


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, _PID_BYTES, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
