"""LogManager (topics on disk), topic-config derivation and open_storage URLs."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from broker_core.storage import (
    LogConfig,
    LogManager,
    PartitionLog,
    TopicExists,
    UnknownTopic,
    log_config_for_topic,
    open_storage,
)
from tests.batches import make_batch
from tests.storage_helpers import headed

DEFAULT = LogConfig(segment_bytes=4096)


def append(manager: LogManager, name: str, partition: int, count: int) -> int:
    log = manager.partition(name, partition)
    assert log is not None
    return log.append(*headed(make_batch(count)))


def test_create_and_reload_topics(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, DEFAULT)
    info = manager.create_topic("public/default/orders", 3, {"retention.ms": "1000"})
    assert info.num_partitions == 3
    assert info.configs == {"retention.ms": "1000"}
    assert isinstance(info.topic_id, uuid.UUID)
    other = manager.create_topic("tenant1/ns/events", 1, {})
    with pytest.raises(TopicExists):
        manager.create_topic("public/default/orders", 1, {})
    assert (tmp_path / "topics" / "public" / "default" / "orders" / "2").is_dir()
    log = manager.partition("public/default/orders", 2)
    assert log is not None and log.config.retention_ms == 1000
    assert log.config.segment_bytes == 4096
    assert manager.partition("public/default/orders", 3) is None
    assert manager.partition("nope/nope/nope", 0) is None
    assert append(manager, "public/default/orders", 1, 5) == 0
    assert append(manager, "public/default/orders", 1, 2) == 5
    manager.close()

    manager = LogManager(tmp_path, DEFAULT)
    assert sorted(t.name for t in manager.topics()) == [
        "public/default/orders",
        "tenant1/ns/events",
    ]
    assert manager.topic("public/default/orders") == info
    assert manager.topic("tenant1/ns/events") == other
    assert manager.topic("public/default/missing") is None
    log = manager.partition("public/default/orders", 1)
    assert log is not None and log.next_offset == 7
    assert log.config.retention_ms == 1000
    assert sorted((n, p) for n, p, _ in manager.all_partitions()) == [
        ("public/default/orders", 0),
        ("public/default/orders", 1),
        ("public/default/orders", 2),
        ("tenant1/ns/events", 0),
    ]
    manager.close()


def test_returned_info_is_a_copy(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, DEFAULT)
    info = manager.create_topic("a/b/c", 1, {"x": "1"})
    info.configs["x"] = "2"
    info.num_partitions = 9
    stored = manager.topic("a/b/c")
    assert stored is not None
    assert stored.configs == {"x": "1"} and stored.num_partitions == 1
    manager.close()


def test_delete_topic(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, DEFAULT)
    first = manager.create_topic("t/n/gone", 2, {})
    manager.create_topic("t/n/kept", 1, {})
    append(manager, "t/n/gone", 0, 3)
    manager.delete_topic("t/n/gone")
    with pytest.raises(UnknownTopic):
        manager.delete_topic("t/n/gone")
    assert manager.topic("t/n/gone") is None
    assert manager.partition("t/n/gone", 0) is None
    assert not (tmp_path / "topics" / "t" / "n" / "gone").exists()
    assert list((tmp_path / "trash").iterdir()) == []
    again = manager.create_topic("t/n/gone", 1, {})
    assert again.topic_id != first.topic_id
    log = manager.partition("t/n/gone", 0)
    assert log is not None and log.next_offset == 0
    manager.delete_topic("t/n/kept")
    manager.delete_topic("t/n/gone")
    assert not (tmp_path / "topics" / "t").exists()  # empty parents are removed
    manager.close()
    assert LogManager(tmp_path, DEFAULT).topics() == []


def test_interrupted_delete_and_create_are_cleaned_up(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, DEFAULT)
    manager.create_topic("t/n/x", 1, {})
    manager.close()
    # a deletion that got as far as the rename into the trash
    (tmp_path / "topics" / "t" / "n" / "x").rename(tmp_path / "trash" / "leftover")
    # a creation that never wrote topic.json
    (tmp_path / "topics" / "t" / "n" / "y" / "0").mkdir(parents=True)
    (tmp_path / "topics" / "t" / "n" / "y" / "0" / "partition.json").write_text("{}")
    manager = LogManager(tmp_path, DEFAULT)
    assert manager.topics() == []
    assert list((tmp_path / "trash").iterdir()) == []
    manager.create_topic("t/n/y", 1, {})
    log = manager.partition("t/n/y", 0)
    assert log is not None and log.next_offset == 0
    manager.close()


def test_add_partitions(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, DEFAULT)
    manager.create_topic("a/b/c", 2, {"segment.bytes": "2000"})
    append(manager, "a/b/c", 0, 4)
    with pytest.raises(ValueError):
        manager.add_partitions("a/b/c", 2)
    with pytest.raises(UnknownTopic):
        manager.add_partitions("a/b/missing", 3)
    # a stale directory from an earlier, interrupted add_partitions
    (tmp_path / "topics" / "a" / "b" / "c" / "3").mkdir()
    info = manager.add_partitions("a/b/c", 5)
    assert info.num_partitions == 5
    new = manager.partition("a/b/c", 4)
    assert new is not None and new.config.segment_bytes == 2000
    manager.close()
    manager = LogManager(tmp_path, DEFAULT)
    stored = manager.topic("a/b/c")
    assert stored is not None and stored.num_partitions == 5
    log = manager.partition("a/b/c", 0)
    assert log is not None and log.next_offset == 4
    manager.close()


def test_alter_topic_configs(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, DEFAULT)
    manager.create_topic("a/b/c", 2, {"retention.ms": "5000", "cleanup.policy": "delete"})
    info = manager.alter_topic_configs("a/b/c", {"retention.bytes": "100000"})
    assert info.configs == {"retention.bytes": "100000"}
    for p in range(2):
        log = manager.partition("a/b/c", p)
        assert log is not None
        assert log.config.retention_bytes == 100000
        assert log.config.retention_ms == DEFAULT.retention_ms
    with pytest.raises(ValueError, match=r"segment\.ms"):
        manager.alter_topic_configs("a/b/c", {"segment.ms": "soon"})
    with pytest.raises(UnknownTopic):
        manager.alter_topic_configs("a/b/missing", {})
    manager.close()
    manager = LogManager(tmp_path, DEFAULT)
    stored = manager.topic("a/b/c")
    assert stored is not None and stored.configs == {"retention.bytes": "100000"}
    log = manager.partition("a/b/c", 1)
    assert log is not None and log.config.retention_bytes == 100000
    manager.close()


def test_invalid_topics_are_refused(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, DEFAULT)
    with pytest.raises(ValueError, match=r"retention\.bytes"):
        manager.create_topic("a/b/c", 1, {"retention.bytes": "-2"})
    with pytest.raises(ValueError):
        manager.create_topic("a/b/c", 0, {})
    with pytest.raises(ValueError):
        manager.create_topic("a/../c", 1, {})
    with pytest.raises(ValueError):
        manager.create_topic("a//c", 1, {})
    manager.create_topic("a/b/c", 1, {})
    with pytest.raises(ValueError, match="nests"):
        manager.create_topic("a/b/c/d", 1, {})
    with pytest.raises(ValueError, match="nests"):
        manager.create_topic("a/b", 1, {})
    assert [t.name for t in manager.topics()] == ["a/b/c"]
    manager.close()


def test_retention_and_flush_over_all_partitions(tmp_path: Path) -> None:
    now = [1_000_000]
    manager = LogManager(tmp_path, DEFAULT, clock=lambda: now[0])
    manager.create_topic("a/b/short", 2, {"retention.ms": "1000", "segment.bytes": "300"})
    manager.create_topic("a/b/long", 1, {"segment.bytes": "300"})
    for _ in range(6):
        for name, partition in (("a/b/short", 0), ("a/b/short", 1), ("a/b/long", 0)):
            append(manager, name, partition, 1)
    manager.flush_all()
    now[0] += 60_000
    dropped = manager.enforce_retention()
    assert dropped > 0
    for p in range(2):
        log = manager.partition("a/b/short", p)
        assert log is not None
        assert log.ledger_count == 1 and log.log_start_offset > 0
    long_log = manager.partition("a/b/long", 0)
    assert long_log is not None and long_log.log_start_offset == 0
    manager.close()


def test_log_config_for_topic() -> None:
    base = LogConfig()
    derived = log_config_for_topic(
        base,
        {
            "segment.bytes": "1024",
            "segment.ms": "60000",
            "retention.ms": "-1",
            "retention.bytes": " 5000 ",
            "index.interval.bytes": "128",
            "compression.type": "zstd",
        },
    )
    assert derived == LogConfig(
        segment_bytes=1024,
        segment_ms=60000,
        retention_ms=-1,
        retention_bytes=5000,
        index_interval_bytes=128,
    )
    assert log_config_for_topic(base, {}) == base
    with pytest.raises(ValueError, match=r"'segment\.bytes'"):
        log_config_for_topic(base, {"segment.bytes": "0"})
    with pytest.raises(ValueError, match=r"'index\.interval\.bytes'"):
        log_config_for_topic(base, {"index.interval.bytes": "1.5"})
    with pytest.raises(ValueError, match="segment_bytes"):
        LogConfig(segment_bytes=0)


def test_open_storage_urls(tmp_path: Path) -> None:
    for url in (f"file://{tmp_path}/one", f"file://localhost{tmp_path}/two", str(tmp_path / "3")):
        manager = open_storage(url)
        manager.create_topic("a/b/c", 1, {})
        manager.close()
    assert (tmp_path / "one" / "topics" / "a" / "b" / "c" / "topic.json").exists()
    assert (tmp_path / "two" / "topics" / "a" / "b" / "c" / "topic.json").exists()
    assert (tmp_path / "3" / "topics" / "a" / "b" / "c" / "topic.json").exists()
    manager = open_storage(f"file://{tmp_path}/with%20space", LogConfig(segment_bytes=1000))
    manager.create_topic("a/b/c", 1, {})
    log = manager.partition("a/b/c", 0)
    assert isinstance(log, PartitionLog) and log.config.segment_bytes == 1000
    manager.close()
    assert (tmp_path / "with space" / "topics").is_dir()
    with pytest.raises(ValueError, match="'mysql'"):
        open_storage("mysql://db.example/kafka")
    with pytest.raises(ValueError, match="'s3'"):
        open_storage("s3://bucket/prefix")
    with pytest.raises(ValueError, match="host"):
        open_storage("file://otherhost/data")
    with pytest.raises(ValueError, match="absolute"):
        open_storage("file:relative/data")
