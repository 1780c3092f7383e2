"""Durable file-system helpers: atomic file replacement and directory fsync."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

TEMP_SUFFIX = ".tmp"


def fsync_dir(directory: Path) -> None:
    """fsync a directory so that entries created, renamed or removed in it are durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: write a temp file, fsync, rename, fsync the directory."""
    temp = path.with_name(path.name + TEMP_SUFFIX)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, path)
    fsync_dir(path.parent)


def write_json_atomically(path: Path, document: Any) -> None:
    """Atomically replace ``path`` with ``document`` as indented JSON."""
    text = json.dumps(document, indent=1, sort_keys=True) + "\n"
    write_atomically(path, text.encode("utf-8"))


def read_json(path: Path) -> Any:
    """Read a JSON file; FileNotFoundError if absent, ValueError if not JSON."""
    with open(path, "rb") as f:
        return json.loads(f.read())
