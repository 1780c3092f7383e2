"""The resources DescribeConfigs, AlterConfigs and IncrementalAlterConfigs name: their
types, and what Kafka checks of a BROKER or BROKER_LOGGER resource before its configs
(the caller's right on the cluster, then the broker's id: a broker answers for itself,
and for the cluster-wide default, named by the empty string)."""

from __future__ import annotations

import re

from broker_core.context import Operation, RequestContext
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.tenancy import Tenancy

TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP = 2, 4, 8, 16, 32
TYPE_NAMES = {TOPIC: "TOPIC", BROKER: "BROKER", BROKER_LOGGER: "BROKER_LOGGER",
              CLIENT_METRICS: "CLIENT_METRICS", GROUP: "GROUP"}
CLUSTER_DEFAULT = ""
"""The BROKER resource of the cluster-wide default (Kafka's dynamic default configs)."""
_INT = re.compile(r"[+-]?[0-9]{1,10}")
_INT_MAX = 2**31 - 1


def check_cluster_right(tenancy: Tenancy, ctx: RequestContext, operation: Operation) -> None:
    """CLUSTER_AUTHORIZATION_FAILED unless the caller may apply ``operation`` to the
    cluster (Kafka checks it of a BROKER or BROKER_LOGGER resource before its name)."""
    if not tenancy.cluster_allowed(ctx, operation):
        raise KafkaApiError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                            "Cluster authorization failed.")


def check_broker_name(broker_id: int, name: str) -> None:
    """INVALID_REQUEST, in Kafka's words, unless ``name`` is this broker's id or the
    cluster-wide default: a broker answers for itself only."""
    if name == CLUSTER_DEFAULT:
        return
    if not _INT.fullmatch(name) or abs(int(name)) > _INT_MAX:
        raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                            f"Broker id must be an integer, but it is: {name[:100]}")
    if int(name) != broker_id:
        raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                            f"Unexpected broker id, expected {broker_id} or empty string, "
                            f"but received {name}")


def unsupported(resource_type: int) -> KafkaApiError:
    """INVALID_REQUEST for a resource type whose configs this broker does not keep."""
    return KafkaApiError(ErrorCode.INVALID_REQUEST, "Unsupported resource type: "
                         f"{TYPE_NAMES.get(resource_type, resource_type)}")
