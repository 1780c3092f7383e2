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


def write_atomically(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data``: write a temp file, fsync, rename, fsync the directory.

    A failure (say, ENOSPC) leaves ``path`` as it was and removes the temp file. With
    ``durable`` False nothing is fsynced: for a file in a directory nobody reads yet, made
    durable with everything else by one :func:`sync_filesystem` before it is used.
    """
    temp = write_temp(path, data, durable=durable)
    install_temp(temp, path)
    if durable:
        fsync_dir(path.parent)


def write_temp(path: Path, data: bytes, *, durable: bool) -> Path:
    """The first half of :func:`write_atomically`: ``data`` in ``path``'s temp file
    (fsynced if ``durable``), which is returned; a failure removes it. Many files replaced
    at once write their temp files, make them durable together (one
    :func:`sync_filesystem`), then :func:`install_temp` each and sync once more."""
    temp = path.with_name(path.name + TEMP_SUFFIX)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return temp


def install_temp(temp: Path, path: Path) -> None:
    """Rename the temp file ``temp`` over ``path`` (removing it if that fails); the rename
    is durable once ``path``'s directory is fsynced or its file system synced."""
    try:
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def write_json_atomically(path: Path, document: object, *, durable: bool = True) -> None:
    """Atomically replace ``path`` with ``document`` as indented JSON (``object``: any
    document json.dumps takes, such as a TypedDict); ``durable`` as for
    :func:`write_atomically`."""
    write_atomically(path, json_bytes(document), durable=durable)


def json_bytes(document: object) -> bytes:
    """``document`` as the JSON the metadata files hold: keys sorted, each member of the
    top object and each item of a list there on a line of its own, what lies deeper on
    that line. Each line is written by json's C encoder: the indenting encoder is pure
    Python, and a partition of hundreds of ledgers rewrites its ``partition.json`` (one
    item per ledger) at every roll and every swap of a cleaned ledger."""
    return (_layout(document, 0) + "\n").encode("utf-8")


_LAID_OUT_DEPTH = 2
"""How many levels of objects and lists :func:`json_bytes` spreads over lines."""


def _layout(value: object, depth: int) -> str:
    if depth >= _LAID_OUT_DEPTH or not isinstance(value, dict | list) or not value:
        return json.dumps(value, sort_keys=True)
    pad = " " * (depth + 1)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(str(key))}: {_layout(value[key], depth + 1)}"
                 for key in sorted(value)]
        return "{\n" + ",\n".join(items) + "\n" + pad[1:] + "}"
    items = [pad + _layout(item, depth + 1) for item in value]
    return "[\n" + ",\n".join(items) + "\n" + pad[1:] + "]"


def read_json(path: Path) -> JsonValue:
    """Read a JSON file; FileNotFoundError if absent, ValueError if not JSON."""
    with open(path, "rb") as f:
        document: JsonValue = json.loads(f.read())
    return document


def _load_syncfs() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        function = libc.syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    return cast(Callable[[int], int], function)


_SYNCFS = _load_syncfs()


def sync_filesystem(directory: Path) -> None:
    """Make everything written to the file system holding ``directory`` durable: every
    file's data and every directory entry created, renamed or removed (Linux ``syncfs``,
    which reports write-back errors since 5.8; ``sync`` elsewhere). One call costs about
    one fsync, against one per file and directory: it is how many files created at once
    (a topic's partitions) become durable together."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        sync_file_system_of(fd)
    finally:
        os.close(fd)


def sync_file_system_of(fd: int) -> None:
    """:func:`sync_filesystem` for the file system holding the open file ``fd``."""
    if _SYNCFS is None:
        os.sync()
        return
    if _SYNCFS(fd) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"syncfs: {os.strerror(code)}")


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
