"""Producer ids, handed out from blocks claimed in the storage's key-value area.

The entry records the first id of the next block. A block is claimed by moving that entry
past it with ``compare_and_set`` before any id of the block is used, so no id is ever
given twice: not after a crash, and not by two brokers sharing the storage (the loser of
a race claims the next block)."""

from __future__ import annotations

import json

from broker_core.storage import KeyValueStore

BLOCK_SIZE = 1000
KEY = "producer-ids.json"
"""The storage key-value entry that records the first id of the next block."""


class ProducerIdAllocator:
    """Allocates producer ids from a block claimed in the key-value area."""

    def __init__(self, kv: KeyValueStore, block_size: int = BLOCK_SIZE) -> None:
        self.kv = kv
        self.block_size = block_size
        self._next = self._block_end = 0  # no block yet: the first allocation claims one

    def _claim_block(self) -> None:
        while True:
            stored = self.kv.get(KEY)
            start = int(json.loads(stored)["nextBlockStart"]) if stored is not None else 0
            end = start + self.block_size
            if self.kv.compare_and_set(KEY, stored,
                                       json.dumps({"nextBlockStart": end}).encode()):
                self._next, self._block_end = start, end
                return

    def allocate(self) -> int:
        """A producer id never handed out before (by any broker sharing the storage)."""
        if self._next >= self._block_end:
            self._claim_block()
        allocated = self._next
        self._next += 1
        return allocated
