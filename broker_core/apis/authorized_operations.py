"""Authorized operations (KIP-430): which operations the caller may apply to a topic, a group
or the cluster, answered by Metadata, DescribeCluster, DescribeGroups and
DescribeTopicPartitions as a bitfield of Kafka's ACL operation codes.

Each resource type is asked about exactly the operations Kafka's authorizer supports for
it, so a principal allowed everything sees the same set as on Kafka (all 7 cluster
operations, 8 topic operations, 3 group operations).
"""

from __future__ import annotations

from broker_core.context import OPERATION_CODES, Operation, RequestContext, ResourceType
from broker_core.engine import Engine

SUPPORTED: dict[ResourceType, tuple[Operation, ...]] = {
    ResourceType.TOPIC: (Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DELETE,
                         Operation.ALTER, Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS,
                         Operation.ALTER_CONFIGS),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE),
    ResourceType.CLUSTER: (Operation.CREATE, Operation.CLUSTER_ACTION,
                           Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS,
                           Operation.IDEMPOTENT_WRITE, Operation.ALTER, Operation.DESCRIBE),
    ResourceType.TRANSACTIONAL_ID: (Operation.DESCRIBE, Operation.WRITE),
}
"""The operations Kafka's authorizer supports per resource type."""


def authorized_operations(engine: Engine, ctx: RequestContext, resource: ResourceType,
                          name: str) -> set[int]:
    """The codes of the supported operations the caller may apply to the resource (for a
    topic, ``name`` is the full internal name)."""
    return {OPERATION_CODES[operation] for operation in SUPPORTED[resource]
            if engine.authorizer.authorize(ctx, operation, resource, name, log_denied=False)}


def bitfield(codes: set[int]) -> int:
    """The codes as one 32-bit field, for schemas that carry a plain int32."""
    return sum(1 << code for code in codes)
