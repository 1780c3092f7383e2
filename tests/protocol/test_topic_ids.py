"""``TopicsById``: a request naming topics by id reads the topic list once, however many ids
it names (one read per id let a thousand ids against ten thousand topics hold the loop)."""

from __future__ import annotations

import uuid

from broker_core.storage import LogConfig, TopicInfo
from broker_core.storage.memory import MemoryStorage
from broker_core.topic_ids import TopicsById


class CountingStorage(MemoryStorage):
    """A memory storage that counts reads of its topic list."""

    reads = 0

    def topics(self) -> list[TopicInfo]:
        self.reads += 1
        return super().topics()


def test_ids_are_looked_up_in_one_read() -> None:
    storage = CountingStorage(LogConfig(), clock=lambda: 0)
    ids = [storage.create_topic(f"public/default/t{i}", 1, {}).topic_id for i in range(20)]
    by_id = TopicsById(storage)
    assert storage.reads == 0  # nothing read before an id is asked for
    for topic_id in ids:
        found = by_id.get(topic_id)
        assert found is not None and found.topic_id == topic_id
    assert by_id.get(uuid.uuid4()) is None and by_id.get(None) is None
    assert storage.reads == 1
