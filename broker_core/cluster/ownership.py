"""What this broker owns in the cluster: the partitions it writes, with the epoch of each
claim, and who is told when that changes.

The cluster service (:mod:`broker_core.cluster.service`) decides what to claim, hand over
or give up, and records each outcome here (:meth:`OwnedPartitions.claimed`,
:meth:`OwnedPartitions.lose`); the rest of the broker reads ``owned`` and registers for
the changes (``on_gained`` / ``on_lost``: the leadership loads or forgets producer and
coordinator state, the transaction-marker relay wakes). ``moves`` counts the changes: it
is part of the stamp on which the service skips a reconcile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from broker_core.storage.cluster import ClusterStore, TopicPartition

log = logging.getLogger(__name__)


@dataclass
class _Listeners:
    gained: list[Callable[[TopicPartition, int], None]] = field(default_factory=list)
    lost: list[Callable[[TopicPartition], None]] = field(default_factory=list)


class OwnedPartitions:
    """The partitions this broker writes, with the epoch of its claim of each."""

    def __init__(self, store: ClusterStore) -> None:
        self.store = store
        self.owned: dict[TopicPartition, int] = {}
        """Partitions this broker writes, with the epoch of its claim."""
        self.moves = 0
        """Counts every change of ``owned`` (part of the stamp a reconcile is skipped on)."""
        self._listeners = _Listeners()

    def on_gained(self, callback: Callable[[TopicPartition, int], None]) -> None:
        """Call ``callback(partition, epoch)`` for each partition this broker takes."""
        self._listeners.gained.append(callback)

    def on_lost(self, callback: Callable[[TopicPartition], None]) -> None:
        """Call ``callback(partition)`` for each partition this broker gives up."""
        self._listeners.lost.append(callback)

    def claimed(self, taken: dict[TopicPartition, int]) -> None:
        """Serve what was claimed from now on."""
        if taken:
            self.moves += 1
        for key, epoch in sorted(taken.items()):
            self.owned[key] = epoch
            for gained in self._listeners.gained:
                gained(key, epoch)
        if taken and self.store.shared:
            log.info("took %d partitions (e.g. %s-%d at epoch %d)", len(taken),
                     *min(taken), taken[min(taken)])

    def forget_topic(self, topic: str) -> None:
        """A topic was deleted: its partitions are owned by nobody any more."""
        self.lose([key for key in self.owned if key[0] == topic])

    def lose(self, keys: list[TopicPartition]) -> None:
        """Stop serving ``keys`` (those owned): nothing is written to them from now on."""
        if not keys:
            return
        self.moves += 1
        self.store.drop(keys)
        for key in keys:
            if self.owned.pop(key, None) is not None:
                for lost in self._listeners.lost:
                    lost(key)
