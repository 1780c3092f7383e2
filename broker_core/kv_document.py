"""One document kept under one key of the storage's key-value area, shared by every broker
of a cluster: read once, changed by compare-and-set, read again when others changed it.

The ACLs (``edge.acl_store``) and the client quotas (``broker_core.quotas.store``) are kept
this way: every change is a read-modify-write of the stored document with
``compare_and_set``, retried when another broker changed it meanwhile, so no change is
lost; :meth:`KvDocument.read_again` (called when the storage reports key-value changes)
takes in other brokers' changes without a restart.

A change rewrites the whole document (a file written and fsynced, or a database
transaction): that runs in a worker thread, so the event loop serves every other
connection meanwhile, as does the read of :meth:`KvDocument.read_again`. Changes and
reads of one document take turns, first come first served, so the last change asked for
is the last one stored and no read in between puts an older value back in memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

from broker_core.storage import KeyValueStore

_T = TypeVar("_T")


class KvDocument(Generic[_T]):
    """The parsed value of ``key``; ``parse(None)`` is the value when nothing is stored.
    Values are immutable: an edit returns a new one."""

    def __init__(self, kv: KeyValueStore, key: str, parse: Callable[[bytes | None], _T],
                 encode: Callable[[_T], bytes]) -> None:
        self.kv = kv
        self.key = key
        self._parse = parse
        self._encode = encode
        stored = kv.get(key)
        self._state: tuple[_T, bytes | None] = (parse(stored), stored)
        """The value as last read or written, and its stored bytes (one attribute: a
        worker thread reads the pair whole)."""
        self._turns = asyncio.Lock()

    @property
    def value(self) -> _T:
        """The value as last read or written."""
        return self._state[0]

    async def read_again(self) -> bool:
        """Take in the stored value if another broker changed it; return whether it did."""
        async with self._turns:
            stored = await asyncio.to_thread(self.kv.get, self.key)
            if stored == self._state[1]:
                return False
            self._state = (self._parse(stored), stored)
            return True

    async def change(self, edit: Callable[[_T], _T]) -> _T:
        """Store ``edit`` of the current value (the stored one, whoever wrote it); return
        the new value. ``edit`` runs in a worker thread, maybe more than once (when another
        broker wrote meanwhile), and must raise, not store, when the change is refused;
        what it or the write raises (OSError: a full disk) is raised here."""
        async with self._turns:
            self._state = await asyncio.to_thread(self._stored_change, edit, self._state)
            return self._state[0]

    def _stored_change(self, edit: Callable[[_T], _T], known: tuple[_T, bytes | None]
                       ) -> tuple[_T, bytes | None]:
        """:meth:`change`'s read-modify-write (in a worker thread): the value and bytes
        stored after it, ``known`` being those before."""
        value, last = known
        while True:
            stored = self.kv.get(self.key)
            # the value as last read or written, unless another broker changed it since
            current = value if stored == last else self._parse(stored)
            wanted = edit(current)
            if wanted == current:
                return current, stored
            encoded = self._encode(wanted)
            if self.kv.compare_and_set(self.key, stored, encoded):
                return wanted, encoded
