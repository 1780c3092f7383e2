"""Helpers for storage tests: the bytes of what ``PartitionLog.read`` returns."""

from __future__ import annotations

from broker_core.storage import FileRegion


def batch_bytes(chunk: memoryview | FileRegion) -> bytes:
    """A batch's bytes, whether it came back as a memoryview or as a file region."""
    if isinstance(chunk, FileRegion):
        try:
            return chunk.read()
        finally:
            chunk.release()
    return bytes(chunk)
