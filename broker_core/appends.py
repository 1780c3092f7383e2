"""The one way a batch enters a partition: ``AppendPath``.

Client produce, transaction markers, the broker's own topics and the audit topic all append
through it, so each of them gets the same three things: a failed write becomes a Kafka
error and one log line per cause (``storage_faults``), parked long-poll fetches of the
partition are woken (``waiters``), and the fsync policy counts the records
(``durability``: ``flushIntervalMessages`` / ``flushIntervalMs``).
"""

from __future__ import annotations

import asyncio

from broker_core.durability import FlushScheduler
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.storage import PartitionStore
from broker_core.storage.cluster import NotOwner
from broker_core.storage_faults import WriteKind
from broker_core.waiters import AppendWaiters, TopicPartition


class AppendPath:
    """Appends batches to partition stores, with fault handling, wake-ups and fsync policy."""

    def __init__(self, waiters: AppendWaiters, flusher: FlushScheduler) -> None:
        self.waiters = waiters
        self.flusher = flusher
        self.faults = flusher.faults

    def append(self, key: TopicPartition, partition: PartitionStore, batch: bytearray,
               last_offset_delta: int, max_timestamp: int, records: int, kind: WriteKind,
               code: ErrorCode = ErrorCode.KAFKA_STORAGE_ERROR, what: str | None = None,
               ) -> tuple[int, asyncio.Future[None] | None]:
        """Append ``batch`` (``records`` records) to ``partition`` of topic-partition
        ``key``; return its base offset and what to await before acknowledging it (None:
        nothing yet). A failed write raises KafkaApiError ``code`` and is logged as a fault
        of ``kind`` writing ``what`` (default: the topic-partition)."""
        try:  # not faults.guard: this is the produce hot path
            base = partition.append(batch, last_offset_delta, max_timestamp)
        except OSError as exc:
            raise self.faults.failed(exc, what or f"{key[0]}-{key[1]}", kind, code) from None
        except NotOwner as exc:  # another broker took the partition: the write is fenced
            raise KafkaApiError(ErrorCode.NOT_LEADER_OR_FOLLOWER
                                if code == ErrorCode.KAFKA_STORAGE_ERROR else code,
                                str(exc)) from None
        self.faults.succeeded(kind)
        self.waiters.notify(key)
        return base, self.flusher.appended(partition, records)
