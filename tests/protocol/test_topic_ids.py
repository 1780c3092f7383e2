"""``TopicsById``: a request naming topics by id reads the topic list once, however many ids
it names (one read per id let a thousand ids against ten thousand topics hold the loop)."""

from __future__ import annotations

import uuid

from broker_core.storage import LogConfig
from broker_core.topic_ids import TopicsById
from tests.storage_helpers import TopicReadsCounted


def test_ids_are_looked_up_in_one_read() -> None:
    storage = TopicReadsCounted(LogConfig(), clock=lambda: 0)
    ids = [storage.create_topic(f"public/default/t{i}", 1, {}).topic_id for i in range(20)]
    by_id = TopicsById(storage)
    assert storage.reads == 0  # nothing read before an id is asked for
    for topic_id in ids:
        found = by_id.get(topic_id)
        assert found is not None and found.topic_id == topic_id
    assert by_id.get(uuid.uuid4()) is None and by_id.get(None) is None
    assert storage.reads == 1
