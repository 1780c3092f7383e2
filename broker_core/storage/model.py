"""Plain values every storage engine shares: topics as stored (``TopicInfo``), stored
batches (``BatchInfo``) and the broker's clock."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypedDict

from common.json_types import JsonValue, json_int

_FORMAT_VERSION = 1


def wall_clock_ms() -> int:
    """Milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class BatchInfo:
    """What the ledger knows about one stored entry."""

    base_offset: int
    last_offset: int
    """base_offset + lastOffsetDelta."""
    max_timestamp: int
    """The batch header's maxTimestamp."""
    broker_timestamp: int
    """Wall-clock ms at which the broker appended the batch."""
    batch: memoryview | bytes
    """The record batch bytes (with the assigned base offset)."""


class TopicJson(TypedDict):
    """A topic's metadata file."""

    version: int
    name: str
    topicId: str
    numPartitions: int
    configs: dict[str, str]


@dataclass(frozen=True, slots=True)
class NewTopic:
    """A topic to create: its full internal name, partition count and own configs, and the
    caps of its tenant that its creation must keep (None: none)."""

    name: str
    num_partitions: int
    configs: Mapping[str, str]
    cap: TenantCap | None = None


@dataclass(frozen=True)
class TenantCap:
    """The most topics and partitions a tenant may hold, checked where a creation is
    stored: an engine shared by several brokers counts under a lock of the tenant's, so
    that creations through several brokers at once cannot pass the cap together."""

    prefix: str
    """The start of the tenant's topic names (``tenant/``)."""
    excluded: str
    """The start of the broker's own topics of the tenant, which count for nobody."""
    max_topics: int | None
    max_partitions: int | None


@dataclass
class TopicInfo:
    """A topic as stored: its full internal name, id, partition count and configs."""

    name: str
    topic_id: uuid.UUID
    num_partitions: int
    configs: dict[str, str] = field(default_factory=dict)

    def copy(self) -> TopicInfo:
        return TopicInfo(self.name, self.topic_id, self.num_partitions, dict(self.configs))

    def to_json(self) -> TopicJson:
        return {
            "version": _FORMAT_VERSION,
            "name": self.name,
            "topicId": str(self.topic_id),
            "numPartitions": self.num_partitions,
            "configs": dict(self.configs),
        }

    @classmethod
    def from_json(cls, doc: JsonValue) -> TopicInfo:
        if not isinstance(doc, dict) or doc.get("version") != _FORMAT_VERSION:
            raise ValueError("not a topic metadata document of a known version")
        configs = doc["configs"]
        if not isinstance(configs, dict):
            raise ValueError("topic configs are not an object")
        return cls(
            name=str(doc["name"]),
            topic_id=uuid.UUID(str(doc["topicId"])),
            num_partitions=json_int(doc["numPartitions"]),
            configs={str(k): str(v) for k, v in configs.items()},
        )


def topic_name_parts(name: str) -> list[str]:
    """The ``/``-separated parts of a topic name; ValueError for an empty or dot part."""
    parts = name.split("/")
    for part in parts:
        if part in ("", ".", "..") or "\0" in part:
            raise ValueError(f"invalid topic name {name!r}")
    return parts


def check_no_nesting(name: str, existing: Iterable[str]) -> None:
    """ValueError if ``name`` is a path prefix of an existing topic or the reverse."""
    for other in existing:
        if other.startswith(name + "/") or name.startswith(other + "/"):
            raise ValueError(f"topic name {name!r} nests with existing topic {other!r}")
