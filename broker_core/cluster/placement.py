"""Where a topic's partitions belong among the live brokers: every broker computes the same
answer from the same inputs, so no one has to hand it out.

Rendezvous hashing with bounded load: each partition ranks the brokers by a hash of
(topic, partition, broker) and goes to the best-ranked broker still below
``ceil(partitions / brokers)`` partitions of that topic. A topic is spread evenly; when a
broker leaves, mostly its own partitions move; when nothing changes, nothing moves.

A *pinned* topic (one partition per broker, as the audit topic: each broker writes its own)
puts partition ``i`` on the broker holding slot ``i`` (``slots``) while it is live, and the
others as above.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from functools import lru_cache


def _score(topic: str, partition: int, broker: int) -> int:
    digest = hashlib.blake2b(f"{topic}\x00{partition}\x00{broker}".encode(),
                             digest_size=8).digest()
    return int.from_bytes(digest, "big")


@lru_cache(maxsize=4096)
def _assign(topic: str, num_partitions: int, brokers: tuple[int, ...]) -> tuple[int, ...]:
    cap = -(-num_partitions // len(brokers))
    load = dict.fromkeys(brokers, 0)
    chosen: list[int] = []
    for partition in range(num_partitions):
        ranked = sorted(brokers, key=lambda b: _score(topic, partition, b), reverse=True)
        best = next(b for b in ranked if load[b] < cap)
        load[best] += 1
        chosen.append(best)
    return tuple(chosen)


def assign(topic: str, num_partitions: int, brokers: Sequence[int]) -> tuple[int, ...]:
    """The broker each partition of ``topic`` belongs to (empty when no broker is live)."""
    if not brokers or num_partitions <= 0:
        return ()
    return _assign(topic, num_partitions, tuple(sorted(set(brokers))))


def preferred(topic: str, partition: int, num_partitions: int,
              brokers: Sequence[int], pinned: Mapping[int, int] | None = None) -> int | None:
    """The broker ``partition`` of ``topic`` belongs to, or None when no broker is live;
    ``pinned`` (slot -> broker id) for a pinned topic."""
    holder = None if pinned is None else pinned.get(partition)
    if holder is not None and holder in brokers:
        return holder
    placed = assign(topic, num_partitions, brokers)
    return placed[partition] if 0 <= partition < len(placed) else None
