"""The one type of a stretch of an open file that a response carries as it is.

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
