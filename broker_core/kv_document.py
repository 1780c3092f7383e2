"""One document kept under one key of the storage's key-value area, shared by every broker
of a cluster: read once, changed by compare-and-set, read again when others changed it.

The ACLs (``edge.acl_store``) and the client quotas (``broker_core.quotas.store``) are kept
this way: every change is a read-modify-write of the stored document with
``compare_and_set``, retried when another broker changed it meanwhile, so no change is
lost; :meth:`KvDocument.read_again` (called when the storage reports key-value changes)
takes in other brokers' changes without a restart.
"""

from __future__ import annotations

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
        self._stored = kv.get(key)
        self.value: _T = parse(self._stored)

    def read_again(self) -> bool:
        """Take in the stored value if another broker changed it; return whether it did."""
        stored = self.kv.get(self.key)
        if stored == self._stored:
            return False
        self.value, self._stored = self._parse(stored), stored
        return True

    def change(self, edit: Callable[[_T], _T]) -> _T:
        """Store ``edit`` of the current value (the stored one, whoever wrote it); return
        the new value. ``edit`` may run more than once (when another broker wrote
        meanwhile) and must raise, not store, when the change is refused."""
        while True:
            stored = self.kv.get(self.key)
            # the value as last read or written, unless another broker changed it since
            current = self.value if stored == self._stored else self._parse(stored)
            wanted = edit(current)
            if wanted == current:
                break
            encoded = self._encode(wanted)
            if self.kv.compare_and_set(self.key, stored, encoded):
                stored, current = encoded, wanted
                break
        self.value, self._stored = current, stored
        return current
