"""Topics by id, for the requests that name topics by id (Metadata v10+, DeleteTopics
v6+): one read of the topic list per request, the first time it names an id, not one per
id (a request naming a thousand ids against ten thousand stored topics copied ten million
topic records, before any authorization check)."""

from __future__ import annotations

import uuid

from broker_core.storage import Storage, TopicInfo


class TopicsById:
    """The storage's topics by id, as read once for one request."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._found: dict[uuid.UUID, TopicInfo] | None = None

    def get(self, topic_id: uuid.UUID | None) -> TopicInfo | None:
        """The topic with ``topic_id``, None when there is none."""
        if self._found is None:
            self._found = {topic.topic_id: topic for topic in self._storage.topics()}
        return None if topic_id is None else self._found.get(topic_id)
