"""Offset lookups that follow partitions moving between brokers.

librdkafka's admin ListOffsets finds each partition's leader in its metadata cache and
does not refresh that cache when the leader moved (confluent-kafka 2.x): the new leader's
FENCED_LEADER_EPOCH or NOT_LEADER_OR_FOLLOWER reaches the caller as the partition's
error, and while the cached leader is gone (stopped, or killed) the request waits for it
until its timeout and then reports offset -1001 (OFFSET_INVALID) *with no error*. Kafka's
Java admin client refreshes its metadata and retries instead. :func:`list_offsets` does
what the Java client does: it refreshes the topics' metadata and asks again for the
partitions without a good answer, until its deadline. A consumer's watermark query does
the same as the admin client's (it waits for the broker that is gone, or fails with
``_DESTROY_BROKER`` when that broker's connection closes): :func:`log_start` refreshes
and asks again too.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import confluent_kafka
from confluent_kafka import IsolationLevel, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, OffsetSpec

Partition = tuple[str, int]
"""(topic, partition)."""

ATTEMPT_SECONDS = 5.0
"""One ListOffsets request's timeout: a lookup stuck on a leader that is gone ends here."""
PAUSE_SECONDS = 0.2
"""Between two attempts (a moved partition's new owner claims it meanwhile)."""
OFFSET_INVALID = -1001
"""librdkafka's answer for a partition whose request timed out (never a real offset)."""
AGAIN = frozenset({
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.REQUEST_TIMED_OUT,
    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._NOENT, KafkaError._UNKNOWN_PARTITION,
    KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._DESTROY_BROKER,
})
"""Partition errors that stale metadata or a move explain: refresh, then ask again."""


def list_offsets(admin: AdminClient, wanted: Mapping[Partition, OffsetSpec],
                 isolation: IsolationLevel, timeout_s: float) -> dict[Partition, int]:
    """The offset each of ``wanted`` names (by its spec, at ``isolation``), asking again
    for ``timeout_s`` while a partition has no good answer; then the last error is raised
    (a KafkaException, as confluent-kafka raises)."""
    deadline = time.monotonic() + timeout_s
    found: dict[Partition, int] = {}
    while True:
        pending = {tp: spec for tp, spec in wanted.items() if tp not in found}
        if not pending:
            return found
        remaining = deadline - time.monotonic()
        attempt = _attempt_s(remaining)
        error = _ask(admin, pending, isolation, attempt, found)
        if error is None:
            continue
        if remaining <= 0:
            raise KafkaException(error)
        for topic in sorted({t for t, p in pending if (t, p) not in found}):
            admin.list_topics(topic, timeout=attempt)
        time.sleep(PAUSE_SECONDS)


def _ask(admin: AdminClient, pending: Mapping[Partition, OffsetSpec],
         isolation: IsolationLevel, timeout_s: float,
         found: dict[Partition, int]) -> KafkaError | None:
    """One ListOffsets for ``pending``; good answers go into ``found``. The error of a
    partition to ask again for (None: every answer was good); any other error is raised."""
    futures = admin.list_offsets(
        {confluent_kafka.TopicPartition(t, p): spec for (t, p), spec in pending.items()},
        isolation_level=isolation, request_timeout=timeout_s)
    again: KafkaError | None = None
    for tp, future in futures.items():
        key = (tp.topic, tp.partition)
        try:
            offset = int(future.result(timeout_s + ATTEMPT_SECONDS).offset)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if not _again(error):
                raise
            again = error
            continue
        if offset == OFFSET_INVALID:
            again = KafkaError(KafkaError._TIMED_OUT,
                               f"no ListOffsets answer for {tp.topic}-{tp.partition} within "
                               f"{timeout_s:g} s")
            continue
        found[key] = offset
    return again


def _attempt_s(remaining_s: float) -> float:
    """One request's timeout with ``remaining_s`` left: at most ``ATTEMPT_SECONDS``, at
    least a second (the last attempt, past the deadline, still gets one)."""
    return max(1.0, min(ATTEMPT_SECONDS, remaining_s))


def _again(error: KafkaError) -> bool:
    """Whether a lookup that failed with ``error`` is worth asking again."""
    return error.code() in AGAIN or error.retriable()


def log_start(consumer: confluent_kafka.Consumer, topic: str, partition: int,
              timeout_s: float) -> int:
    """The partition's log start offset, asked of its leader now (again, for
    ``timeout_s``, with the topic's metadata refreshed, while the partition moves)."""
    deadline = time.monotonic() + timeout_s
    tp = confluent_kafka.TopicPartition(topic, partition)
    while True:
        remaining = deadline - time.monotonic()
        attempt = _attempt_s(remaining)
        try:
            low, _high = consumer.get_watermark_offsets(tp, timeout=attempt, cached=False)
            return int(low)
        except KafkaException as exc:
            if remaining <= 0 or not _again(exc.args[0]):
                raise
        consumer.list_topics(topic, timeout=attempt)
        time.sleep(PAUSE_SECONDS)
