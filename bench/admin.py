"""Topic creation, deletion and config changes through the Kafka admin API (the same calls
for both brokers)."""

from __future__ import annotations

import sys

from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from confluent_kafka.cimpl import NewTopic


def create_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 60.0,
                 config: dict[str, str] | None = None,
                 client: dict[str, str] | None = None) -> None:
    """Create ``topic`` with ``partitions`` partitions (and topic ``config``) and wait
    until it is in metadata; ``client``: further admin client settings (security)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "bench-admin",
                         **(client or {})})
    futures = admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})],
                                  operation_timeout=timeout, request_timeout=timeout)
    for future in futures.values():
        future.result(timeout)
    metadata = admin.list_topics(topic, timeout=timeout)
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or len(found.partitions) != partitions:
        raise RuntimeError(f"topic {topic} not ready: {found and found.error}")


def delete_topic(bootstrap: str, topic: str, timeout: float = 60.0) -> None:
    """Delete ``topic`` (best effort: frees the brokers' memory and disk between trials)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "bench-admin"})
    futures = admin.delete_topics([topic], operation_timeout=timeout, request_timeout=timeout)
    for future in futures.values():
        try:
            future.result(timeout)
        except Exception as exc:  # a leftover topic only costs memory
            print(f"[bench] could not delete {topic}: {exc}", file=sys.stderr, flush=True)


def set_topic_configs(bootstrap: str, topic: str, configs: dict[str, str],
                      timeout: float = 60.0) -> None:
    """Set topic configs with IncrementalAlterConfigs."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "bench-admin"})
    entries = [ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
               for name, value in configs.items()]
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource],
                                                  request_timeout=timeout).values():
        future.result(timeout)
