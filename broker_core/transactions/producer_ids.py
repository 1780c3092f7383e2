"""Producer ids, handed out from blocks whose end is persisted before any id of the block
is used, so no id is ever given twice, even after a crash."""

from __future__ import annotations

import json
import os
from pathlib import Path

BLOCK_SIZE = 1000


class ProducerIdAllocator:
    """Allocates producer ids; the file records the first id of the next block."""

    def __init__(self, path: Path, block_size: int = BLOCK_SIZE) -> None:
        self.path = path
        self.block_size = block_size
        start = json.loads(path.read_text())["nextBlockStart"] if path.exists() else 0
        self._next = start
        self._block_end = start

    def allocate(self) -> int:
        """A producer id never handed out before."""
        if self._next >= self._block_end:
            self._block_end = self._next + self.block_size
            temp = self.path.with_suffix(".tmp")
            with open(temp, "w") as handle:
                json.dump({"nextBlockStart": self._block_end}, handle)
                handle.flush()
                os.fsync(handle.fileno())
            temp.replace(self.path)
        allocated = self._next
        self._next += 1
        return allocated
