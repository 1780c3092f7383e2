"""``TopicTable``: the topics an engine holds (name -> info, log config, partition stores)
and the lookups every engine answers the same way; engines subclass it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from .cluster import NotOwner
from .config import LogConfig, log_config_for_topic
from .errors import LogClosed, TopicExists, UnknownTopic
from .feed import NO_FEED, ChangeFeed
from .model import TopicInfo, check_no_nesting, topic_name_parts
from .protocols import NOTHING_CHANGED, Refreshed
from .retention import RetentionCut, RetentionDue


class _Partition(Protocol):
    def retention_due(self) -> RetentionCut | None: ...

    def drop_retained(self, cut: RetentionCut) -> int: ...

    @property
    def drops_in_thread(self) -> bool: ...

    @property
    def size_bytes(self) -> int: ...


P = TypeVar("P", bound=_Partition)


@dataclass
class TopicEntry(Generic[P]):
    """One topic as an engine holds it."""

    info: TopicInfo
    config: LogConfig
    partitions: list[P]


class TopicTable(Generic[P]):
    """The topics of one engine, guarded by one re-entrant lock; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._topics: dict[str, TopicEntry[P]] = {}
        self._creating: set[str] = set()
        """Names being created outside the lock (taken: see ``_check_free``)."""
        self._closed = False

    def topic(self, name: str) -> TopicInfo | None:
        with self._lock:
            topic = self._topics.get(name)
            return None if topic is None else topic.info.copy()

    def topics(self) -> list[TopicInfo]:
        with self._lock:
            return [topic.info.copy() for topic in self._topics.values()]

    def partition(self, name: str, partition: int) -> P | None:
        with self._lock:
            topic = self._topics.get(name)
            if topic is None or not 0 <= partition < len(topic.partitions):
                return None
            return topic.partitions[partition]

    def all_partitions(self) -> Iterator[tuple[str, int, P]]:
        """A snapshot of (topic name, partition, store) for every partition."""
        with self._lock:
            snapshot = [
                (name, p, log)
                for name, topic in self._topics.items()
                for p, log in enumerate(topic.partitions)
            ]
        return iter(snapshot)

    def topic_sizes(self) -> dict[str, int]:
        """Bytes stored per topic: its partitions' sizes summed (this process holds them
        all; the shared engine overrides it with one read of the database)."""
        sizes: dict[str, int] = {}
        for name, _index, log in self.all_partitions():
            sizes[name] = sizes.get(name, 0) + log.size_bytes
        return sizes

    def partition_keys(self) -> list[tuple[str, int]]:
        """(topic name, partition) of every partition."""
        return [(name, index) for name, index, _ in self.all_partitions()]

    def refresh(self) -> Refreshed:
        """Nothing to take in: one process owns this engine (the shared one overrides it)."""
        return NOTHING_CHANGED

    @property
    def feed(self) -> ChangeFeed:
        """No other broker changes this engine: nothing to be told (``feed``)."""
        return NO_FEED

    def retention_due(self) -> list[RetentionDue]:
        """What retention drops of every partition (its first step: reads only, a query
        per partition with sealed segments on PostgreSQL; call it from a worker thread)."""
        due: list[RetentionDue] = []
        for _, _, log in self.all_partitions():
            with contextlib.suppress(LogClosed, NotOwner):  # gone, or moved to another broker
                cut = log.retention_due()
                if cut is not None:
                    due.append(RetentionDue(log, cut))
        return due

    @staticmethod
    def drop_retained(due: Sequence[RetentionDue]) -> int:
        """Drop what ``retention_due`` found (on the event loop, or in a worker thread
        when every partition of ``due`` says ``drops_in_thread``); segments dropped."""
        dropped = 0
        for item in due:
            with contextlib.suppress(LogClosed, NotOwner):
                dropped += item.store.drop_retained(item.cut)
        return dropped

    def enforce_retention(self) -> int:
        """Apply retention to every partition at once; the number of segments dropped."""
        return self.drop_retained(self.retention_due())

    @staticmethod
    def _new_topic_config(name: str, num_partitions: int, configs: Mapping[str, str],
                          default: LogConfig) -> tuple[dict[str, str], LogConfig]:
        """The configs of a topic to create and their LogConfig; ValueError for a bad name,
        partition count or config."""
        topic_name_parts(name)
        if num_partitions < 1:
            raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
        own = dict(configs)
        return own, log_config_for_topic(default, own)

    def _check_free(self, name: str) -> None:
        """TopicExists or ValueError unless ``name`` can be created (lock held)."""
        self._check_open()
        if name in self._topics or name in self._creating:
            raise TopicExists(name)
        check_no_nesting(name, self._topics)
        check_no_nesting(name, self._creating)

    def _growing(self, name: str, new_total: int) -> TopicEntry[P]:
        """The topic ``name`` if ``new_total`` grows it; UnknownTopic or ValueError."""
        topic = self._topic(name)
        current = topic.info.num_partitions
        if new_total <= current:
            raise ValueError(
                f"topic {name!r} has {current} partitions; cannot change to {new_total}")
        return topic

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosed("the storage is closed")

    def _topic(self, name: str) -> TopicEntry[P]:
        self._check_open()
        topic = self._topics.get(name)
        if topic is None:
            raise UnknownTopic(name)
        return topic
