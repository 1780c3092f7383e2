"""Driver-side questions to the cluster: which partitions a subscription covers, and their
earliest, latest (the last stable offset under read_committed) and by-time offsets.

Metadata goes through a consumer (a consumer's Metadata request never creates topics);
offsets through the admin client's batched ListOffsets with the read's isolation level.
"""

from __future__ import annotations

import logging
import re

import confluent_kafka
from confluent_kafka import IsolationLevel
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec, ResourceType

from pipeline import clients
from pipeline.offsets import EARLIEST, LATEST, Offsets, Spec, TopicPartition
from pipeline.options import KafkaOptions

log = logging.getLogger(__name__)
TIMEOUT_SECONDS = 30.0


class ClusterView:
    """Partitions and offsets of the subscribed topics; clients are opened lazily."""

    def __init__(self, options: KafkaOptions) -> None:
        self.options = options
        self._consumer: confluent_kafka.Consumer | None = None
        self._admin: AdminClient | None = None

    @property
    def consumer(self) -> confluent_kafka.Consumer:
        """The metadata consumer."""
        if self._consumer is None:
            self._consumer = clients.consumer(self.options)
        return self._consumer

    @property
    def admin(self) -> AdminClient:
        """The admin client for ListOffsets."""
        if self._admin is None:
            self._admin = clients.admin(self.options)
        return self._admin

    def close(self) -> None:
        """Close the clients."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._admin = None

    def _topic_partitions(self, topic: str) -> list[int]:
        metadata = self.consumer.list_topics(topic=topic, timeout=TIMEOUT_SECONDS)
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            return []
        return sorted(found.partitions)

    def partitions(self) -> list[TopicPartition]:
        """The topic-partitions the subscription covers now, sorted."""
        options = self.options
        if options.assign is not None:
            return sorted((t, p) for t, parts in options.assign.items() for p in parts)
        if options.pattern is not None:
            regex = re.compile(options.pattern)
            listed = self.consumer.list_topics(timeout=TIMEOUT_SECONDS).topics
            return sorted((name, p) for name, topic in listed.items()
                          if regex.fullmatch(name) and topic.error is None
                          for p in topic.partitions)
        return sorted((t, p) for t in options.topics for p in self._topic_partitions(t))

    def compacted(self, topics: set[str]) -> set[str]:
        """Those of ``topics`` whose ``cleanup.policy`` includes ``compact``. A topic whose
        configs cannot be read (no DESCRIBE_CONFIGS permission) counts as not compacted:
        its reads then check every gap against the log start, which is slower, not wrong."""
        if not topics:
            return set()
        futures = self.admin.describe_configs(
            [ConfigResource(ResourceType.TOPIC, topic) for topic in sorted(topics)],
            request_timeout=TIMEOUT_SECONDS)
        found: set[str] = set()
        for resource, future in futures.items():
            try:
                entry = future.result().get("cleanup.policy")
            except confluent_kafka.KafkaException as exc:
                log.warning("edgekafka: cannot read the cleanup.policy of %s (%s); reading it "
                            "as a topic that is not compacted", resource.name, exc)
                continue
            if entry is not None and "compact" in str(entry.value).split(","):
                found.add(resource.name)
        return found

    def _list_offsets(self, wanted: dict[TopicPartition, OffsetSpec]) -> Offsets:
        if not wanted:
            return {}
        level = (IsolationLevel.READ_COMMITTED if self.options.isolation_level == "read_committed"
                 else IsolationLevel.READ_UNCOMMITTED)
        futures = self.admin.list_offsets(
            {confluent_kafka.TopicPartition(t, p): spec for (t, p), spec in wanted.items()},
            isolation_level=level, request_timeout=TIMEOUT_SECONDS)
        return {(tp.topic, tp.partition): future.result().offset
                for tp, future in futures.items()}

    def earliest(self, tps: list[TopicPartition]) -> Offsets:
        """Log start offsets."""
        return self._list_offsets({tp: OffsetSpec.earliest()  # type: ignore[no-untyped-call]
                                   for tp in tps})

    def latest(self, tps: list[TopicPartition]) -> Offsets:
        """High watermarks, or last stable offsets under read_committed."""
        return self._list_offsets({tp: OffsetSpec.latest()  # type: ignore[no-untyped-call]
                                   for tp in tps})

    def for_timestamp(self, tps: list[TopicPartition], timestamp_ms: int) -> Offsets:
        """The first offset at or after ``timestamp_ms``, or the latest when there is none."""
        found = self._list_offsets({tp: OffsetSpec.for_timestamp(timestamp_ms) for tp in tps})
        missing = [tp for tp, offset in found.items() if offset < 0]
        return found | self.latest(missing)

    def resolve(self, spec: Spec, tps: list[TopicPartition], default: int) -> Offsets:
        """Concrete offsets for ``spec``; partitions a JSON spec leaves out take ``default``
        (-2 earliest, -1 latest)."""
        if spec == "earliest":
            return self.earliest(tps)
        if spec == "latest":
            return self.latest(tps)
        assert isinstance(spec, dict)
        wanted = {tp: spec.get(tp, default) for tp in tps} | dict(spec)
        earliest = self.earliest([tp for tp, o in wanted.items() if o == EARLIEST])
        latest = self.latest([tp for tp, o in wanted.items() if o == LATEST])
        return {tp: earliest.get(tp, latest.get(tp, offset)) for tp, offset in wanted.items()}
