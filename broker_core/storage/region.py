"""A record batch left in its ledger file, to be sent with ``sendfile`` instead of read
(on TLS the connection writer reads it from the descriptor in chunks).

A region holds its own duplicate of the ledger's file descriptor, so the bytes stay
readable even if retention deletes the ledger before the response leaves. It also keeps
the batch's 61-byte header, which fetch needs (base offset, last offset delta, record
count) without touching the rest.
"""

from __future__ import annotations

import os


class FileRegion:
    """``length`` bytes at ``offset`` of an open file; ``release`` closes the descriptor."""

    __slots__ = ("fd", "head", "length", "offset")

    def __init__(self, fd: int, offset: int, length: int, head: bytes) -> None:
        self.fd = os.dup(fd)
        self.offset = offset
        self.length = length
        self.head = head

    def __len__(self) -> int:
        return self.length

    def release(self) -> None:
        """Close the duplicate descriptor (idempotent)."""
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __del__(self) -> None:
        self.release()
