"""The record walker in C (``broker_core/codec/native/record_walk.c``), loaded with ctypes.

``make`` compiles the C file into a shared library in the venv (``$(NATIVE)`` in the
Makefile; nothing compiled is committed, and pip's build does not involve it). This
module loads it from ``$EDGE_RECORD_WALK_LIB`` when set, else from ``<venv>/lib``; when
the library is missing, fails to load or implements another ABI, :data:`NATIVE` is None
and :mod:`broker_core.codec.records` walks records in Python, as :data:`NOTE` says (the
broker logs it once at start).

It is loaded with :class:`ctypes.PyDLL`: the GIL stays held while it walks (a 64 MiB
batch takes milliseconds), and the C side takes the buffer with CPython's buffer API, so
bytes, bytearrays and memoryviews are walked in place. The C walker only judges: it
answers 0, or an error code with the failing record's index and start;
:mod:`broker_core.codec.records` then walks that one record in Python to word the error,
so the messages have one home and both walkers answer alike.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path
from typing import Literal, NamedTuple

__all__ = ["ABI", "LIBRARY_ENV", "LIBRARY_NAME", "NATIVE", "NOTE", "Failure",
           "NativeWalker", "default_path", "load"]

ABI = 2
"""What ``record_walk_abi()`` must answer (bump both together when the C signature, or a
verdict, changes: 2 refuses 32-bit record varints over 5 bytes, as the Python walker)."""
LIBRARY_ENV = "EDGE_RECORD_WALK_LIB"
LIBRARY_NAME = "edge_broker_record_walk.so"


class Failure(NamedTuple):
    """The C walker's verdict on a batch that does not parse."""

    code: int
    record: int
    """the failing record's index (for a count mismatch: the records found)"""
    start: int
    """where that record starts (for a count mismatch: where the walk ended)"""


class NativeWalker:
    """The loaded C walker."""

    def __init__(self, library: ctypes.PyDLL, path: str) -> None:
        self.path = path
        self._walk = library.record_walk_object
        self._walk.argtypes = [ctypes.py_object, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
        self._walk.restype = ctypes.c_int
        self._failure = library.record_walk_failure
        self._failure.argtypes = [ctypes.POINTER(ctypes.c_int64)]
        self._failure.restype = None

    def walk(self, buf: bytes | bytearray | memoryview, pos: int, count: int,
             keyed: bool) -> Failure | Literal[False] | None:
        """Walk the ``count`` records in ``buf[pos:]``: None when they parse, their
        :class:`Failure` when not, False when ``buf`` is not contiguous (walk it in
        Python then)."""
        try:
            code = self._walk(buf, pos, count, keyed)
        except BufferError:
            return False
        if code == 0:
            return None
        out = (ctypes.c_int64 * 2)()
        self._failure(out)  # this thread's last failure
        return Failure(code, out[0], out[1])


def default_path() -> Path:
    """Where the Makefile puts the library: the running venv's ``lib``."""
    return Path(sys.prefix) / "lib" / LIBRARY_NAME


def load(path: str | None = None) -> tuple[NativeWalker | None, str]:
    """The walker from ``path`` (default: ``$EDGE_RECORD_WALK_LIB``, else
    :func:`default_path`), or None; and one line saying which walker runs and why."""
    where = path or os.environ.get(LIBRARY_ENV) or str(default_path())
    fallback = "validateRecords walks records in Python (about 3 us a record)"
    if not os.path.exists(where):
        return None, f"{fallback}: no native walker at {where} (make builds it)"
    try:
        # RTLD_NOW: a symbol the interpreter lacks fails here, not at the first call
        library = ctypes.PyDLL(where, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        abi = int(library.record_walk_abi())
    except (OSError, AttributeError) as exc:
        return None, f"{fallback}: the native walker at {where} does not load: {exc}"
    if abi != ABI:
        return None, (f"{fallback}: the native walker at {where} has ABI {abi}, not {ABI} "
                      "(make rebuilds it)")
    return NativeWalker(library, where), f"validateRecords walks records in C ({where})"


NATIVE, NOTE = load()
