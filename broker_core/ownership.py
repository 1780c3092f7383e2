"""Who owns what: the one place that maps a group or transactional id to its coordinator.

Metadata, FindCoordinator and the coordinators all call these functions, so they can
never disagree (KoP's NOT_COORDINATOR bugs came from two different computations).
Today one broker owns everything; a cluster will answer here from its coordination
service.
"""

from __future__ import annotations


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units), as a signed 32-bit int."""
    value = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        value = (31 * value + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def coordinator_partition(key: str, partitions: int) -> int:
    """The partition of a system topic (``__consumer_offsets``) that holds ``key``'s state.

    The same stable hash Kafka uses: ``abs(key.hashCode()) % partitions``.
    """
    hashed = java_string_hash(key)
    positive = 0 if hashed == -(1 << 31) else abs(hashed)
    return positive % partitions


def coordinator_node(broker_id: int, key: str) -> int:
    """The broker that coordinates ``key``: with a single broker, always this one."""
    del key
    return broker_id
