"""Producer ids, handed out from blocks whose end is persisted before any id of the block
is used, so no id is ever given twice, even after a crash."""

from __future__ import annotations

import json

from broker_core.storage import KeyValueStore

BLOCK_SIZE = 1000
KEY = "producer-ids.json"
"""The storage key-value entry that records the first id of the next block."""


class ProducerIdAllocator:
    """Allocates producer ids; the key-value entry records the first id of the next block."""

    def __init__(self, kv: KeyValueStore, block_size: int = BLOCK_SIZE) -> None:
        self.kv = kv
        self.block_size = block_size
        stored = kv.get(KEY)
        start = int(json.loads(stored)["nextBlockStart"]) if stored is not None else 0
        self._next = start
        self._block_end = start

    def allocate(self) -> int:
        """A producer id never handed out before."""
        if self._next >= self._block_end:
            block_end = self._next + self.block_size
            self.kv.put(KEY, json.dumps({"nextBlockStart": block_end}).encode())
            self._block_end = block_end
        allocated = self._next
        self._next += 1
        return allocated
