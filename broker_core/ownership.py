"""Where a group or transactional id lives: the partition of its state topic.

Which broker owns that partition is the cluster's one ownership function
(``cluster.service.ClusterService.leader``), which Metadata, FindCoordinator and the
coordinators all use, so they can never disagree (KoP's NOT_COORDINATOR bugs came from
two different computations).
"""

from __future__ import annotations

import functools


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units), as a signed 32-bit int."""
    value = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        value = (31 * value + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


@functools.lru_cache(maxsize=1 << 14)
def coordinator_partition(key: str, partitions: int) -> int:
    """The partition of a system topic (``__consumer_offsets``) that holds ``key``'s state.

    The same stable hash Kafka uses: ``abs(key.hashCode()) % partitions``; remembered for
    the ids in use (a partition leader asks it for every transactional batch it verifies).
    """
    hashed = java_string_hash(key)
    positive = 0 if hashed == -(1 << 31) else abs(hashed)
    return positive % partitions
