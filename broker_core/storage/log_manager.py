"""``LogManager``: the topics and partition logs kept under one storage root directory.

Layout::

    <root>/topics/<name part>/.../<name part>/topic.json   topic id, partition count, configs
    <root>/topics/<name part>/.../<name part>/<n>/         partition n (see ``partition``)
    <root>/trash/<random>/                                 topics being deleted
    <root>/.lock                                           held by the running broker

Topic names are opaque strings whose ``/``-separated parts become nested directories.
``topic.json`` is replaced atomically and written last when a topic is created, so a
directory without it is an unfinished creation. A topic is deleted by renaming its
directory into the trash (one atomic step) and then removing it; leftovers in the
trash are removed at start.

The root is locked (``dir_lock``) before anything in it is read or written, and stays
locked until :meth:`LogManager.close`. A root the manager had to create is removed again
when start-up fails (:meth:`LogManager.discard_created`), so a failed start leaves no
empty data directory behind (a directory that existed is never removed); it is removed
while the lock is still held, so no other broker can have taken it meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .cluster import SoloCluster
from .config import LogConfig, log_config_for_topic
from .dir_lock import DataDirLock
from .errors import ConfigsChanged, LogClosed, TopicExists, UnknownTopic
from .file_kv import FileKeyValues
from .fsutil import (
    TEMP_SUFFIX,
    fsync_dir,
    json_bytes,
    read_json,
    sync_filesystem,
    write_json_atomically,
)
from .model import NewTopic, TenantCap, TopicInfo, topic_name_parts, wall_clock_ms
from .partition import PartitionLog
from .partition_flush import close_together
from .protocols import DiskUsage
from .topic_table import TopicEntry, TopicTable

logger = logging.getLogger(__name__)

TOPIC_FILE = "topic.json"
_TOPICS_DIR = "topics"
_TRASH_DIR = "trash"


def _first_missing(path: Path) -> Path | None:
    """The topmost ancestor of ``path`` (or ``path`` itself) that does not exist yet."""
    missing = None
    for candidate in (path, *path.parents):
        if candidate.exists():
            break
        missing = candidate
    return missing


class LogManager(TopicTable[PartitionLog]):
    """All topics and partition logs under ``root``; thread-safe."""

    def __init__(
        self,
        root: Path,
        default_config: LogConfig,
        *,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        """Open the storage at ``root`` (created if missing), lock it and load every topic
        in it; DataDirLocked when another broker has it."""
        super().__init__()
        self.root = Path(root)
        self.default_config = default_config
        self._clock = clock
        self._topics_dir = self.root / _TOPICS_DIR
        self._trash_dir = self.root / _TRASH_DIR
        self.created = _first_missing(self.root)
        """The topmost directory this manager created for ``root`` (None: it existed)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._dir_lock: DataDirLock | None = None
        self._cluster = SoloCluster(self.partition_keys)
        self._discard = False  # remove ``created`` when the lock is released
        try:
            self._dir_lock = DataDirLock(self.root)
            self._topics_dir.mkdir(exist_ok=True)
            self._trash_dir.mkdir(exist_ok=True)
            self._empty_trash()
            self._load_dir(self._topics_dir, [])
        except BaseException:
            self.discard_created()
            raise

    @property
    def location(self) -> str:
        """The data directory's absolute path."""
        return str(self.root.resolve())

    def names_location(self, path: str) -> bool:
        """Whether ``path`` resolves to the data directory; a path no file system takes
        (a NUL byte in it) names none."""
        return "\x00" not in path and os.path.realpath(path) == self.location

    @property
    def cluster(self) -> SoloCluster:
        return self._cluster

    @property
    def kv(self) -> FileKeyValues:
        """Files in the data directory (``meta.properties``, ``acls.json``, ...)."""
        return FileKeyValues(self.root)

    def disk_usage(self) -> DiskUsage:
        """Size and free space of the data directory's file system."""
        disk = os.statvfs(self.root)
        return DiskUsage(disk.f_blocks * disk.f_frsize, disk.f_bavail * disk.f_frsize)

    # -- loading -----------------------------------------------------------------------

    def _empty_trash(self) -> None:
        for entry in os.scandir(self._trash_dir):
            logger.info("removing %s left from an interrupted topic deletion", entry.path)
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                Path(entry.path).unlink(missing_ok=True)

    def _load_dir(self, directory: Path, parts: list[str]) -> None:
        if (directory / TOPIC_FILE).is_file():
            self._load_topic(directory, "/".join(parts))
            return
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            if entry.is_dir(follow_symlinks=False):
                self._load_dir(Path(entry.path), [*parts, entry.name])

    def _load_topic(self, directory: Path, name: str) -> None:
        (directory / (TOPIC_FILE + TEMP_SUFFIX)).unlink(missing_ok=True)
        try:
            info = TopicInfo.from_json(read_json(directory / TOPIC_FILE))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{directory / TOPIC_FILE}: unreadable topic metadata: {exc}") from exc
        if info.name != name:
            logger.warning(
                "%s: records topic name %r; using the directory's name %r",
                directory,
                info.name,
                name,
            )
            info.name = name
        try:
            config = log_config_for_topic(self.default_config, info.configs)
        except ValueError as exc:
            logger.warning("%s: %s; using the default log config", directory, exc)
            config = self.default_config
        partitions: list[PartitionLog] = []
        present = set(os.listdir(directory))
        for p in range(info.num_partitions):
            listed = str(p) in present
            if not listed:
                logger.warning("%s: partition %d has no directory; starting it empty", name, p)
            partitions.append(PartitionLog(directory / str(p), config, clock=self._clock,
                                           listed=listed))
        self._topics[name] = TopicEntry(info, config, partitions)

    # -- topics ------------------------------------------------------------------------

    def create_topic(self, name: str, num_partitions: int, configs: Mapping[str, str]) -> TopicInfo:
        """Create a topic with a fresh random id; TopicExists if the name is taken."""
        result = self.create_topics([NewTopic(name, num_partitions, configs)])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def create_topics(self, wanted: Sequence[NewTopic]) -> list[TopicInfo | Exception]:
        """Create topics with fresh random ids, durable together (see ``_build``); for
        each, its info or why it was not created. The names are taken under the lock, the
        files are made outside it: lookups and appends of other topics go on meanwhile (a
        request creating 10,000 partitions runs in a worker thread)."""
        results: list[TopicInfo | Exception] = []
        taken: list[tuple[int, TopicInfo, LogConfig]] = []
        with self._lock:
            for new in wanted:
                try:
                    configs, config = self._new_topic_config(new.name, new.num_partitions,
                                                             new.configs, self.default_config)
                    self._check_free(new.name)
                except (TopicExists, ValueError, LogClosed) as exc:
                    results.append(exc)
                    continue
                self._creating.add(new.name)
                info = TopicInfo(new.name, uuid.uuid4(), new.num_partitions, configs)
                results.append(info)
                taken.append((len(results) - 1, info, config))
        built: dict[str, list[PartitionLog]] = {}
        try:
            built = self._build(taken, results)
        finally:
            with self._lock:
                for _, info, config in taken:
                    self._creating.discard(info.name)
                    partitions = built.get(info.name)
                    if partitions is None:
                        continue
                    if self._closed:  # closed meanwhile: the topic stays on disk
                        for log in partitions:
                            with contextlib.suppress(Exception):
                                log.close()
                        continue
                    self._topics[info.name] = TopicEntry(info, config, partitions)
        return [result.copy() if isinstance(result, TopicInfo) else result
                for result in results]

    def _build(self, taken: Sequence[tuple[int, TopicInfo, LogConfig]],
               results: list[TopicInfo | Exception]) -> dict[str, list[PartitionLog]]:
        """Make the files of the topics ``taken`` (their index in ``results``, their info
        and log config): each topic's partitions, fresh and not fsynced, and its
        ``topic.json`` as a temp file; one ``sync_filesystem`` makes all of that durable,
        then every ``topic.json`` is renamed into place and a second one makes the renames
        durable (a topic exists once its ``topic.json`` does, as with ``write_atomically``,
        for 2 syncs per request instead of 3 fsyncs per partition). A topic whose files
        could not be made gets its OSError in ``results``; the partitions of the others."""
        built: dict[str, list[PartitionLog]] = {}
        for position, info, config in taken:
            directory = self._directory(info.name)
            partitions: list[PartitionLog] = []
            try:
                if directory.exists():
                    logger.warning("%s: removing an unfinished topic creation", directory)
                    self._discard_dir(directory)
                directory.mkdir(parents=True)
                for p in range(info.num_partitions):
                    partitions.append(PartitionLog(directory / str(p), config,
                                                   clock=self._clock, fresh=True))
                (directory / (TOPIC_FILE + TEMP_SUFFIX)).write_bytes(json_bytes(info.to_json()))
            except OSError as exc:
                self._abandon(directory, partitions)
                results[position] = exc
                continue
            built[info.name] = partitions
        try:
            if built:
                sync_filesystem(self._topics_dir)
                for name in built:
                    directory = self._directory(name)
                    os.replace(directory / (TOPIC_FILE + TEMP_SUFFIX), directory / TOPIC_FILE)
                sync_filesystem(self._topics_dir)
        except OSError as exc:
            for position, info, _ in taken:
                if info.name in built:
                    self._abandon(self._directory(info.name), built[info.name])
                    results[position] = exc
            return {}
        return built

    def _abandon(self, directory: Path, partitions: Sequence[PartitionLog]) -> None:
        """Close the partitions of a creation that failed and remove its directory."""
        for log in partitions:
            with contextlib.suppress(Exception):
                log.close()
        with contextlib.suppress(OSError):
            if directory.exists():
                self._discard_dir(directory)

    def delete_topic(self, name: str) -> None:
        """Close the topic's logs and remove its files; UnknownTopic if absent."""
        with self._lock:
            self._check_open()
            topic = self._topics.pop(name, None)
            if topic is None:
                raise UnknownTopic(name)
            for log in topic.partitions:
                with contextlib.suppress(OSError):  # its files go: sealing them may fail
                    log.close()
            self._discard_dir(self._directory(name))

    def add_partitions(self, name: str, new_total: int,
                       cap: TenantCap | None = None) -> TopicInfo:
        """Grow the topic to ``new_total`` partitions (ValueError unless it grows, or while
        it is being grown; ``cap``: one broker's own count is exact, nothing to check). The
        new partitions are made outside the lock and made durable together
        (``sync_filesystem``) before ``topic.json`` counts them."""
        del cap
        with self._lock:
            topic = self._growing(name, new_total)
            if name in self._creating:
                raise ValueError(f"topic {name!r} is being grown")
            self._creating.add(name)  # no other growth meanwhile (the name stays taken)
            current, config = topic.info.num_partitions, topic.config
        added: list[PartitionLog] = []
        try:
            try:
                for p in range(current, new_total):
                    directory = self._directory(name) / str(p)
                    if directory.exists():
                        logger.warning("%s: removing an unfinished partition", directory)
                        shutil.rmtree(directory)
                    added.append(PartitionLog(directory, config, clock=self._clock,
                                              fresh=True))
                sync_filesystem(self._topics_dir)
                info = topic.info.copy()
                info.num_partitions = new_total
                with self._lock:
                    self._check_open()
                    if self._topics.get(name) is not topic:
                        raise UnknownTopic(name)
                    write_json_atomically(self._directory(name) / TOPIC_FILE, info.to_json())
                    topic.info = info
                    topic.partitions.extend(added)
                    return info.copy()
            except BaseException:
                for log in added:
                    with contextlib.suppress(Exception):
                        log.close()
                raise
        finally:
            with self._lock:
                self._creating.discard(name)

    def alter_topic_configs(self, name: str, configs: Mapping[str, str],
                            expected: Mapping[str, str] | None = None) -> TopicInfo:
        """Replace the topic's configs (if still ``expected``) and apply the derived
        LogConfig to its partitions."""
        configs = dict(configs)
        config = log_config_for_topic(self.default_config, configs)
        with self._lock:
            topic = self._topic(name)
            if expected is not None and topic.info.configs != expected:
                raise ConfigsChanged(name)
            info = topic.info.copy()
            info.configs = configs
            write_json_atomically(self._directory(name) / TOPIC_FILE, info.to_json())
            topic.info = info
            topic.config = config
            for log in topic.partitions:
                log.update_config(config)
            return info.copy()

    # -- maintenance -------------------------------------------------------------------

    def flush_all(self) -> None:
        for _, _, log in self.all_partitions():
            log.flush()

    def close(self) -> list[str]:
        """Close every partition log and release the directory lock; the manager cannot be
        used afterwards. A partition that cannot be closed cleanly (say, its metadata cannot
        be written on a full disk) does not stop the others: the problems are returned, one
        line each, and that partition is recovered from its ledgers at the next start."""
        with self._lock:
            if self._closed:
                return []
            self._closed = True
            problems = self._close_logs()
            self._unlock()
        return problems

    def discard_created(self, *, at_close: bool = False) -> None:
        """After a failed start: remove the data directory if this manager created it
        (anything that existed before is kept), then release it. Closes the manager now,
        or with ``at_close`` marks the directory to go when :meth:`close` releases it
        (a start whose stop closes the storage). A manager already closed removes nothing:
        another broker may own the directory by now."""
        with self._lock:
            self._discard = True
            if not (at_close or self._closed):
                self._closed = True
                self._close_logs()
                self._unlock()

    def _close_logs(self) -> list[str]:
        """Close every partition, together (``close_together``: a syncfs or two for all)."""
        named = [(name, index, log) for name, topic in self._topics.items()
                 for index, log in enumerate(topic.partitions)]
        outcomes = close_together([log for _, _, log in named])
        return [f"could not seal {name}-{index}: {outcome}"
                for (name, index, _), outcome in zip(named, outcomes, strict=True)
                if outcome is not None]

    def _unlock(self) -> None:
        """Release the directory lock, after removing the root if it is to be discarded
        (a manager that lost the lock to another broker touches nothing)."""
        if self._dir_lock is None:
            return
        if self._discard and self.created is not None:
            shutil.rmtree(self.created, ignore_errors=True)
            self.created = None
        self._dir_lock.release()

    # -- helpers -----------------------------------------------------------------------

    def _directory(self, name: str) -> Path:
        """The directory of topic ``name``."""
        return self._topics_dir.joinpath(*topic_name_parts(name))

    def _discard_dir(self, directory: Path) -> None:
        """Move a directory into the trash atomically, then remove it and empty parents."""
        tombstone = self._trash_dir / uuid.uuid4().hex
        directory.rename(tombstone)
        fsync_dir(directory.parent)
        fsync_dir(self._trash_dir)
        shutil.rmtree(tombstone, ignore_errors=True)
        current = directory.parent
        while current != self._topics_dir:
            try:
                current.rmdir()
            except OSError:
                break
            current = current.parent
