"""Names and access: which internal topic or coordinator key a caller's name means, which
topics it sees, and whether the authorizer lets it act.

Every handler asks these questions of :attr:`Engine.tenancy`; the answers depend on the
caller's home namespace (its login), the metadata settings (KoP's ``kafkaMetadataTenant``,
``kafkaEnableMultiTenantMetadata``, ``kopAllowedNamespaces``) and the topics stored.
"""

from __future__ import annotations

from broker_core import naming
from broker_core.context import Authorizer, Operation, RequestContext, ResourceType
from broker_core.engine_config import EngineConfig
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.storage import DiskUsage, Storage, TopicInfo

OFFSETS_TOPIC = "__consumer_offsets"
TXN_TOPIC = "__transaction_state"
CLUSTER_NAME = "kafka-cluster"
"""The name of the cluster resource in ACLs."""
TENANT_LOG_DIR = "/edge-broker/data"
"""The log dir a tenant's login is shown (DescribeLogDirs, AlterReplicaLogDirs): the same
for every tenant and broker, naming nothing of where the storage lives."""
UNKNOWN_DISK = DiskUsage(-1, -1)
"""A log dir's total and usable bytes as Kafka says "unknown" (KIP-827)."""
STORAGE_CONFIGS = frozenset({"log.dirs"})
"""The BROKER resource's configs that say where the storage lives: left out for a tenant's
login."""


class Tenancy:
    """The naming and access questions of the request handlers."""

    def __init__(self, config: EngineConfig, authorizer: Authorizer, storage: Storage) -> None:
        self.config = config
        self.authorizer = authorizer
        self.storage = storage

    def log_dir(self, ctx: RequestContext) -> str:
        """The log dir the caller is shown: the storage's location (a data directory, a
        URL without its password) for the operator, :data:`TENANT_LOG_DIR` for a tenant."""
        return self.storage.location if self.authorizer.is_operator(ctx) else TENANT_LOG_DIR

    def names_log_dir(self, ctx: RequestContext, path: str) -> bool:
        """Whether a log dir the caller names is the one it is shown (so a tenant cannot
        probe for the real location either)."""
        if self.authorizer.is_operator(ctx):
            return self.storage.names_location(path)
        return path == TENANT_LOG_DIR

    def disk_usage(self, ctx: RequestContext) -> DiskUsage:
        """The log dir's total and usable bytes as the caller is shown them (unknown to a
        tenant: the volume is the operator's)."""
        return self.storage.disk_usage() if self.authorizer.is_operator(ctx) else UNKNOWN_DISK

    def allowed(self, ctx: RequestContext, operation: Operation, internal_topic: str,
                log_denied: bool = True) -> bool:
        """Whether the caller may apply ``operation`` to the topic (a denial reported
        unless ``log_denied`` is false: a filter's)."""
        return self.authorizer.authorize(ctx, operation, ResourceType.TOPIC, internal_topic,
                                         log_denied)

    def system_namespace(self, ctx: RequestContext) -> naming.Namespace:
        """Where the caller's groups and transactions are kept (KoP's metadata namespace)."""
        tenant = ctx.home.tenant if self.config.multi_tenant_metadata \
            else self.config.metadata_tenant
        return naming.Namespace(tenant, self.config.metadata_namespace)

    def offsets_topic(self, ctx: RequestContext) -> str:
        """The ``__consumer_offsets`` topic holding the caller's groups."""
        return self.system_namespace(ctx).prefix + OFFSETS_TOPIC

    def txn_topic(self, ctx: RequestContext) -> str:
        """The ``__transaction_state`` topic holding the caller's transactional ids."""
        return self.system_namespace(ctx).prefix + TXN_TOPIC

    def scoped_id(self, ctx: RequestContext, group_id: str) -> str:
        """How the coordinators key a group or transactional id of the caller: the id itself
        in the tenant's own system topics, ``tenant/id`` when the metadata is shared, so
        that tenants never meet in one group either way."""
        if self.config.multi_tenant_metadata:
            return group_id
        return f"{ctx.home.tenant}/{group_id}"

    def client_id_of(self, ctx: RequestContext, key: str) -> str | None:
        """The id a caller knows a coordinator key by, or None when it is another tenant's."""
        if self.config.multi_tenant_metadata:
            return key
        prefix = f"{ctx.home.tenant}/"
        return key[len(prefix):] if key.startswith(prefix) else None

    def is_internal(self, internal: str) -> bool:
        """Whether a topic belongs to the broker (system topics in a metadata namespace)."""
        return naming.in_system_namespace(internal, self.config.metadata_namespace)

    def listed(self, ctx: RequestContext, internal: str) -> bool:
        """Whether "all topics" shows ``internal`` to the caller (``kopAllowedNamespaces``:
        ``${tenant}/ns`` or ``${tenant}/*`` patterns; by default the caller's namespace)."""
        tenant, namespace, _topic = internal.split("/", 2)
        if not self.config.listed_namespaces:
            return f"{tenant}/{namespace}/" == ctx.home.prefix
        for pattern in self.config.listed_namespaces:
            want_tenant, _, want_namespace = pattern.replace(
                "${tenant}", ctx.home.tenant).partition("/")
            if want_tenant == tenant and want_namespace in ("*", namespace):
                return True
        return False

    def check_writable(self, internal: str) -> None:
        """Refuse client writes, creation and deletion of system topics."""
        if self.is_internal(internal):
            raise KafkaApiError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                                f"{internal} is an internal topic of the broker")

    def visible_topics(self, ctx: RequestContext) -> list[TopicInfo]:
        """The topics "all topics" shows the caller: listed for it, ones it may describe,
        not the broker's own; sorted by name."""
        return sorted((topic for topic in self.storage.topics()
                       if self.listed(ctx, topic.name) and not self.is_internal(topic.name)
                       and self.allowed(ctx, Operation.DESCRIBE, topic.name)),
                      key=lambda topic: topic.name)

    def cluster_allowed(self, ctx: RequestContext, operation: Operation,
                        log_denied: bool = True) -> bool:
        """Whether the caller may apply ``operation`` to the cluster."""
        return self.authorizer.authorize(ctx, operation, ResourceType.CLUSTER, CLUSTER_NAME,
                                         log_denied)

    def named_topic(self, ctx: RequestContext, name: str, operation: Operation,
                    action: str) -> tuple[str, TopicInfo]:
        """The internal name and the topic a client names, once the caller may apply
        ``operation`` to it (TOPIC_AUTHORIZATION_FAILED saying it may not ``action`` it,
        then UNKNOWN_TOPIC_OR_PARTITION)."""
        internal = self.internal_name(ctx, name)
        if not self.allowed(ctx, operation, internal):
            raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                f"not allowed to {action} {name}")
        topic = self.storage.topic(internal)
        if topic is None:
            raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name}")
        return internal, topic

    def internal_name(self, ctx: RequestContext, name: str) -> str:
        """The full internal name for a client's topic name (raises INVALID_TOPIC_EXCEPTION)."""
        return naming.to_internal(name, ctx.home)
