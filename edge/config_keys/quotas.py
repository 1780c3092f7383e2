"""Configuration keys of the quotas of a tenant without one of its own, and of how
rates and stored bytes are measured.

These groups of keys are bases of :class:`edge.config.BrokerConfig` (see
:mod:`edge.config` for how a key is declared).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel

from common.settings import key
from edge.config_types import INT_MAX


class QuotaKeys(BaseModel):
    """The quotas of a tenant without one of its own, how its stored bytes are summed, and
    the windows rates are measured over."""

    default_tenant_producer_byte_rate: Annotated[int, key(
        "defaultTenantProducerByteRate",
        "`producer_byte_rate` of each tenant without a quota of its own (bytes per second, "
        "shared by the tenant's connections); a quota set by AlterClientQuotas for a user, "
        "client id, namespace or tenant overrides it; 0 = none", ge=0)] = 0
    default_tenant_consumer_byte_rate: Annotated[int, key(
        "defaultTenantConsumerByteRate",
        "`consumer_byte_rate` of each tenant without a quota of its own (bytes per second); "
        "0 = none", ge=0)] = 0
    default_tenant_request_percentage: Annotated[int, key(
        "defaultTenantRequestPercentage",
        "`request_percentage` of each tenant without a quota of its own (percent of one "
        "event loop's time spent on its requests); 0 = none", ge=0)] = 0
    default_tenant_connection_creation_rate: Annotated[int, key(
        "defaultTenantConnectionCreationRate",
        "`connection_creation_rate` of each tenant without a quota of its own (new "
        "connections per second, counted at login; beyond, a connection is closed); "
        "0 = none", ge=0)] = 0
    default_tenant_controller_mutation_rate: Annotated[int, key(
        "defaultTenantControllerMutationRate",
        "`controller_mutation_rate` of each tenant without a quota of its own (partitions "
        "created or deleted per second by CreateTopics, CreatePartitions and DeleteTopics, "
        "KIP-599; beyond, newer request versions answer THROTTLING_QUOTA_EXCEEDED, older "
        "ones are throttled); 0 = none", ge=0)] = 0
    default_tenant_max_connections: Annotated[int, key(
        "defaultTenantMaxConnections",
        "`max_connections` of each tenant without a quota of its own (open connections of "
        "the tenant, on every broker of a cluster; beyond, a new one is closed at login); "
        "0 = none",
        ge=0)] = 0
    default_tenant_max_topics: Annotated[int, key(
        "defaultTenantMaxTopics",
        "`max_topics` of each tenant without a quota of its own (CreateTopics beyond "
        "answers POLICY_VIOLATION); 0 = none", ge=0)] = 0
    default_tenant_max_partitions: Annotated[int, key(
        "defaultTenantMaxPartitions",
        "`max_partitions` of each tenant without a quota of its own (CreateTopics and "
        "CreatePartitions beyond answer POLICY_VIOLATION); 0 = none", ge=0)] = 0
    default_tenant_max_stored_bytes: Annotated[int, key(
        "defaultTenantMaxStoredBytes",
        "`max_stored_bytes` of each tenant without a quota of its own (bytes its "
        "partitions hold; a produce beyond answers KAFKA_STORAGE_ERROR); 0 = none",
        ge=0)] = 0
    max_quota_entities_per_tenant: Annotated[int, key(
        "maxQuotaEntitiesPerTenant",
        "client quota entities AlterClientQuotas may hold per tenant (its own and its "
        "namespaces'; the user, client-id and default ones, the operator's, count as one "
        "more group); a new one beyond answers POLICY_VIOLATION", ge=1,
        le=INT_MAX)] = 1000
    tenant_usage_check_interval_ms: Annotated[int, key(
        "tenantUsageCheckIntervalMs",
        "how often the bytes each tenant stores are summed up from the partitions' sizes "
        "(between two sums, produced bytes are added as they come)", ge=100,
        le=INT_MAX)] = 5000
    quota_window_num: Annotated[int, key(
        "quotaWindowNum",
        "samples a quota's rate is measured over (Kafka's `quota.window.num`)",
        ge=2, le=3600)] = 11
    quota_window_size_seconds: Annotated[int, key(
        "quotaWindowSizeSeconds",
        "length of one sample, in seconds (Kafka's `quota.window.size.seconds`)",
        ge=1, le=3600)] = 1
