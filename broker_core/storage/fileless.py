"""``FilelessPartition`` and ``FilelessStorage``: what the engines without files
(``memory``, ``postgres``) answer alike: nothing damaged, nothing to verify, write back or
fsync, the same open and offset checks, and the same topic bookkeeping around the
engine's own store (the ``_store_*`` hooks and ``_release``)."""

from __future__ import annotations

import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import TypeVar

from .config import LogConfig, log_config_for_topic
from .damage import Damage
from .errors import (
    ConfigsChanged,
    LogClosed,
    OffsetOutOfRange,
    StorageError,
    TopicExists,
    UnknownTopic,
)
from .model import BatchInfo, NewTopic, TenantCap, TopicInfo
from .retention import RetainsSegments
from .topic_table import TopicEntry, TopicTable


class FilelessPartition(RetainsSegments):
    """Base of a partition store that keeps no files; subclasses set ``_location``,
    ``_closed``, ``_log_start`` and ``_lock`` and define ``next_offset`` and ``_follow``."""

    _location: str
    _closed: bool
    _log_start: int
    _lock: threading.RLock
    _config: LogConfig

    @property
    @abstractmethod
    def next_offset(self) -> int:
        """The offset the next appended batch gets."""

    @abstractmethod
    def _follow(self, offset: int) -> Iterator[BatchInfo]:
        """Batches from ``offset`` on, following appends made while iterating."""

    @property
    @abstractmethod
    def size_bytes(self) -> int:
        """Bytes the partition stores."""

    def batches_from(self, offset: int) -> Iterator[BatchInfo]:
        with self._lock:
            self._check_open()
            self._check_offset(offset)
        return self._follow(offset)

    def headers_from(self, offset: int) -> Iterator[BatchInfo]:
        return self.batches_from(offset)  # whole batches: they are at hand

    @property
    def location(self) -> str:
        return self._location

    @property
    def log_start_offset(self) -> int:
        return self._log_start

    @property
    def offline(self) -> bool:
        return False  # no fsync or disk write to fail for good

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosed(f"partition {self._location} is closed")

    def _check_offset(self, offset: int) -> None:
        if not self._log_start <= offset <= self.next_offset:
            raise OffsetOutOfRange(f"offset {offset} is outside [{self._log_start}, "
                                   f"{self.next_offset}] of {self._location}")

    def damaged_ranges(self) -> list[Damage]:
        return []

    def needs_verification(self, offset: int) -> bool:
        return False

    def verify_at(self, offset: int) -> None:
        return None

    def start_writeback(self) -> None:
        return None

    def flush(self) -> bool:
        return False  # nothing written is waiting for an fsync

    def update_config(self, config: LogConfig) -> None:
        with self._lock:
            self._config = config

    def close(self) -> None:
        with self._lock:
            self._closed = True


FP = TypeVar("FP", bound=FilelessPartition)


class FilelessStorage(TopicTable[FP], ABC):
    """The topics of a fileless engine; subclasses set ``_default_config`` and store what
    changes in the hooks (which raise to refuse it)."""

    _default_config: LogConfig

    @abstractmethod
    def _store_topic(self, info: TopicInfo, config: LogConfig,
                     cap: TenantCap | None) -> list[FP]:
        """Store the new topic ``info`` (CapExceeded when it would take its tenant beyond
        ``cap``); its partition stores (lock held)."""

    @abstractmethod
    def _store_growth(self, name: str, current: int, new_total: int,
                      config: LogConfig, cap: TenantCap | None) -> list[FP]:
        """Store partitions ``current`` to ``new_total - 1`` of ``name``; their stores."""

    def _store_deletion(self, name: str) -> bool:
        """Remove topic ``name`` from the engine's store (lock held); whether it was still
        there (a shared store: another broker may have deleted it meanwhile)."""
        del name
        return True

    def _store_configs(self, name: str, configs: dict[str, str],
                       expected: Mapping[str, str] | None) -> bool:
        """Record the new configs of topic ``name`` in the engine's store (lock held) if
        the stored ones are ``expected`` (None: whatever they are); whether it did (if not,
        the topic as now stored is in the cache)."""
        del name, configs, expected
        return True

    def _release(self) -> list[str]:
        """Release the engine's store after every partition closed; the problems."""
        return []

    def create_topics(self, wanted: Sequence[NewTopic]) -> list[TopicInfo | Exception]:
        """Create the topics one after another (each keeping ``new.cap``: on a shared
        database, counted there); for each, its info or why it was not created."""
        results: list[TopicInfo | Exception] = []
        for new in wanted:
            try:
                results.append(self._create_one(new))
            except (TopicExists, ValueError, OSError, StorageError) as exc:
                results.append(exc)
        return results

    def create_topic(self, name: str, num_partitions: int,
                     configs: Mapping[str, str]) -> TopicInfo:
        return self._create_one(NewTopic(name, num_partitions, configs))

    def _create_one(self, new: NewTopic) -> TopicInfo:
        own, config = self._new_topic_config(new.name, new.num_partitions, new.configs,
                                             self._default_config)
        with self._lock:
            self._check_free(new.name)
            info = TopicInfo(new.name, uuid.uuid4(), new.num_partitions, own)
            stores = self._store_topic(info, config, new.cap)
            self._topics[new.name] = TopicEntry(info, config, stores)
            return info.copy()

    def add_partitions(self, name: str, new_total: int,
                       cap: TenantCap | None = None) -> TopicInfo:
        with self._lock:
            topic = self._growing(name, new_total)
            current = topic.info.num_partitions
            topic.partitions.extend(self._store_growth(name, current, new_total, topic.config,
                                                       cap))
            topic.info.num_partitions = new_total
            return topic.info.copy()

    def delete_topic(self, name: str) -> None:
        with self._lock:
            topic = self._topic(name)
            stored = self._store_deletion(name)
            del self._topics[name]
            for partition in topic.partitions:
                partition.close()
        if not stored:  # only this cache still had it: gone from it now, and unknown
            raise UnknownTopic(name)

    def alter_topic_configs(self, name: str, configs: Mapping[str, str],
                            expected: Mapping[str, str] | None = None) -> TopicInfo:
        configs = dict(configs)
        config = log_config_for_topic(self._default_config, configs)
        with self._lock:
            topic = self._topic(name)
            if expected is not None and topic.info.configs != expected:
                raise ConfigsChanged(name)
            if not self._store_configs(name, configs, expected):
                raise ConfigsChanged(name)
            topic.info.configs = configs
            topic.config = config
            for partition in topic.partitions:
                partition.update_config(config)
            return topic.info.copy()

    def close(self) -> list[str]:
        with self._lock:
            if self._closed:
                return []
            self._closed = True
            for _, _, partition in self.all_partitions():
                partition.close()
        return self._release()
