"""The one type of a framed response, and of a stretch of an open file it carries as it is.

Storage makes them (``broker_core.storage.region.FileRegion``, a record batch left in its
ledger file), the codec counts their length when it frames a response, and the listener
sends them with ``sendfile`` (on TLS it reads them from the descriptor in chunks). Each
of those layers names this Protocol; none imports another for it.
"""

from __future__ import annotations

from typing import Protocol


class FileSpan(Protocol):
    """``len(span)`` bytes at ``offset`` of the open file ``fd``."""

    fd: int
    offset: int

    def __len__(self) -> int:
        """How many bytes the span covers."""
        ...

    def release(self) -> None:
        """Called once the span is sent or dropped."""
        ...


Chunk = bytes | memoryview | FileSpan
"""A piece of a response: bytes in memory, or a stretch of a ledger file (sent with
``sendfile`` on plain TCP, read from its descriptor in chunks on TLS)."""
Frame = bytes | list[Chunk]
"""A framed response: one ``bytes``, or buffers and file spans written in order (the codec
builds them, the listener sends them)."""
