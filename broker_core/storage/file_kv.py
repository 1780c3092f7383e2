"""The file engine's key-value area: one file per key in a directory.

A value is replaced atomically (temp file, rename) through a descriptor of the directory,
so a partition deleted meanwhile (its directory moved to the trash, maybe a new one made
at the same path) never receives a value meant for the old one: the directory is opened
first, then ``check`` confirms its owner is still open. A durable put fsyncs the file
before the rename and the directory after it.

``compare_and_set`` compares and replaces under one lock of this process: the data
directory's lock keeps every other process out, so that is atomic enough for it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

from .fsutil import TEMP_SUFFIX


def _check_key(key: str) -> str:
    if not key or "/" in key or "\0" in key or key.startswith(".") \
            or key.endswith(TEMP_SUFFIX):
        raise ValueError(f"invalid key {key!r}")
    return key


def _no_check() -> None:
    return None


_SWAP = threading.Lock()
"""Held by ``compare_and_set`` from its read to its rename (rare writes: one lock for all
keys is enough)."""


class FileKeyValues:
    """Values stored as files named by their key in ``directory``."""

    def __init__(self, directory: Path, check: Callable[[], None] = _no_check) -> None:
        self.directory = directory
        self._check = check

    def get(self, key: str) -> bytes | None:
        try:
            return (self.directory / _check_key(key)).read_bytes()
        except FileNotFoundError:
            return None

    def put(self, key: str, value: bytes, *, durable: bool = True) -> None:
        name = _check_key(key)
        temp = name + TEMP_SUFFIX
        self._check()
        try:
            directory = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            self._check()  # deleted meanwhile: LogClosed, not a write fault
            raise
        try:
            self._check()
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=directory)
            try:
                try:
                    view = memoryview(value)
                    while view:
                        view = view[os.write(fd, view):]
                    if durable:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(temp, name, src_dir_fd=directory, dst_dir_fd=directory)
            except OSError:  # a full disk: leave no partial file taking space
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=directory)
                raise
            if durable:
                os.fsync(directory)
        finally:
            os.close(directory)

    def compare_and_set(self, key: str, expected: bytes | None, value: bytes) -> bool:
        self._check()
        with _SWAP:
            if self.get(key) != expected:
                return False
            self.put(key, value)
            return True
