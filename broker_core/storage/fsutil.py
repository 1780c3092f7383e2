"""Durable file-system helpers: atomic file replacement and directory fsync."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import cast

from common.json_types import JsonValue

TEMP_SUFFIX = ".tmp"


def fsync_dir(directory: Path) -> None:
    """fsync a directory so that entries created, renamed or removed in it are durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: write a temp file, fsync, rename, fsync the directory.

    A failure (say, ENOSPC) leaves ``path`` as it was and removes the temp file.
    """
    temp = path.with_name(path.name + TEMP_SUFFIX)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json_atomically(path: Path, document: object) -> None:
    """Atomically replace ``path`` with ``document`` as indented JSON (``object``: any
    document json.dumps takes, such as a TypedDict)."""
    text = json.dumps(document, indent=1, sort_keys=True) + "\n"
    write_atomically(path, text.encode("utf-8"))


def read_json(path: Path) -> JsonValue:
    """Read a JSON file; FileNotFoundError if absent, ValueError if not JSON."""
    with open(path, "rb") as f:
        document: JsonValue = json.loads(f.read())
    return document


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        function = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return cast(Callable[[int, int, int, int], int], function)


_SYNC_FILE_RANGE = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, length: int) -> bool:
    """Ask the kernel to start writing ``length`` bytes at ``offset`` to disk, without
    waiting (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``). A later fsync then finds
    little dirty data, so it is short and stalls concurrent appends less. Returns False
    where the call is not available; it is only an optimisation, never needed for safety.
    """
    if _SYNC_FILE_RANGE is None or length <= 0:
        return False
    return _SYNC_FILE_RANGE(fd, offset, length, _SYNC_FILE_RANGE_WRITE) == 0
