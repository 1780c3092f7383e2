"""Driver-side questions to the cluster: which partitions a subscription covers, and their
earliest, latest (the last stable offset under read_committed) and by-time offsets.

Metadata goes through a consumer (a consumer's Metadata request never creates topics);
offsets through the admin client's batched ListOffsets with the read's isolation level.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

import confluent_kafka
from confluent_kafka import IsolationLevel
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    OffsetSpec,
    ResourceType,
    TopicMetadata,
)

from pipeline import clients, lookups
from pipeline.offsets import EARLIEST, LATEST, Offsets, Spec, TopicPartition
from pipeline.options import KafkaOptions, OptionError

log = logging.getLogger(__name__)
TIMEOUT_SECONDS = 30.0


def _listed(found: TopicMetadata | None, topic: str) -> list[int]:
    """The partitions a topic's metadata lists; none when the broker does not know the
    topic; any other error is raised (not taken for a topic that is gone)."""
    if found is None:
        return []
    if found.error is not None:
        if found.error.code() == confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART:
            return []
        raise RuntimeError(f"edgekafka: the metadata of topic {topic}: {found.error}")
    return sorted(found.partitions)


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
        """The topic's partitions; none when the broker does not know the topic."""
        metadata = self.consumer.list_topics(topic=topic, timeout=TIMEOUT_SECONDS)
        return _listed(metadata.topics.get(topic), topic)

    def partitions(self) -> list[TopicPartition]:
        """The topic-partitions the subscription covers now (those of ``assign`` that the
        broker knows), sorted."""
        options = self.options
        if options.assign is not None:
            return sorted((t, p) for t, parts in options.assign.items()
                          for p in set(parts) & set(self._topic_partitions(t)))
        if options.pattern is not None:
            regex = re.compile(options.pattern)
            listed = self.consumer.list_topics(timeout=TIMEOUT_SECONDS).topics
            return sorted((name, p) for name, topic in listed.items()
                          if regex.fullmatch(name) for p in _listed(topic, name))
        return sorted((t, p) for t in options.topics for p in self._topic_partitions(t))

    def check_named(self, named: Iterable[TopicPartition], tps: list[TopicPartition],
                    option: str) -> None:
        """Refuse topic-partitions that ``option`` names beyond ``tps`` (those the
        subscription covers now), saying whether each is outside the subscription or
        unknown to the broker."""
        extra = sorted(set(named) - set(tps))
        if not extra:
            return
        topic, partition = extra[0]
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        if not self.options.covers(topic, partition):
            raise OptionError(f"option {option} names {topic}-{partition}{more}, outside the "
                              f"subscription ({self.options.describe_subscription})")
        known = {t for t, _p in tps}
        what = (f"partition {partition} of topic {topic}" if topic in known
                else f"topic {topic}")
        raise OptionError(f"option {option} names {topic}-{partition}{more}, but the broker "
                          f"has no {what}")

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
        """ListOffsets through the long-lived admin client, asked again while its metadata
        is stale (partitions added since it last looked at a topic, or moved to another
        broker: :mod:`pipeline.lookups`)."""
        if not wanted:
            return {}
        level = (IsolationLevel.READ_COMMITTED if self.options.isolation_level == "read_committed"
                 else IsolationLevel.READ_UNCOMMITTED)
        return lookups.list_offsets(self.admin, wanted, level, TIMEOUT_SECONDS)

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
