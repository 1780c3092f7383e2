"""A partition's one replica, as the replica APIs answer for it: where it is, and why a
request naming other replicas is refused.

Every partition has exactly one replica, its leader: its records are stored once (in a
cluster, in the shared database), never copied between brokers. The broker holding it is
the one the cluster's ownership function names (``ClusterService.leader``: its live owner,
else the broker placement gives it to), the same broker Metadata names as leader; on a
single broker, that broker. A request cannot choose it: ownership follows placement, so a
reassignment or a create-time assignment is accepted only when it names exactly that
broker, and a replication factor above 1 is refused.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker_core.engine import Engine
from broker_core.errors import ErrorCode, KafkaApiError

ONE_REPLICA = ("each partition has one replica, its leader: its records are stored once "
               "(a cluster's brokers share them in the database), not copied between brokers")
"""Why only one replica is ever possible, as the refusals say it."""
_SHOWN = 8
"""Replicas a refusal repeats at most (a request may name thousands)."""


def holder(engine: Engine, internal: str, index: int, num_partitions: int) -> int | None:
    """The broker that holds (or, for a partition not created yet, will hold) partition
    ``index`` of ``internal`` in a topic of ``num_partitions``: Metadata's leader. None
    while no live broker can take it."""
    leader = engine.cluster.leader(internal, index, num_partitions)
    return None if leader is None else leader.broker_id


def hosted_here(engine: Engine, internal: str, index: int, num_partitions: int) -> bool:
    """Whether this broker holds the partition's replica now (what its log dir lists)."""
    return holder(engine, internal, index, num_partitions) == engine.config.broker_id


def replication_factor_error(replication_factor: int) -> KafkaApiError | None:
    """INVALID_REPLICATION_FACTOR for a factor other than 1 (or -1: the default, 1)."""
    if replication_factor in (-1, 1):
        return None
    return KafkaApiError(ErrorCode.INVALID_REPLICATION_FACTOR,
                         f"replication factor {replication_factor} is not possible: "
                         f"{ONE_REPLICA}; use 1")


def assignment_error(engine: Engine, internal: str, shown: str, index: int,
                     num_partitions: int, replicas: Sequence[int],
                     exists: bool = True) -> KafkaApiError | None:
    """INVALID_REPLICA_ASSIGNMENT unless ``replicas`` is exactly the broker holding (or, for
    a partition not created yet, ``exists`` False, to hold) the partition; ``shown`` is the
    topic's name as the caller knows it."""
    placed = holder(engine, internal, index, num_partitions)
    if placed is not None and list(replicas) == [placed]:
        return None
    where = f"partition {index} of {shown} " + (
        "has no live broker to be on" if placed is None
        else f"is on broker {placed}" if exists else f"will be on broker {placed}")
    asked = ", ".join(map(str, replicas[:_SHOWN])) + (", ..." if len(replicas) > _SHOWN else "")
    return KafkaApiError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                         f"{where}; ownership follows the cluster's placement, not requests, "
                         f"and {ONE_REPLICA}: cannot assign [{asked}]")
