"""Read one offset range of one topic-partition, checking that no offset went missing.

The broker keeps offsets continuous: every offset in ``[logStart, highWatermark)`` is one
record or one control record, or, in a compacted topic, was one before the log cleaner
removed it. A read of ``[start, end)`` therefore accounts for every offset in it:
delivered records, and jumps between them. A jump is *invisible data* (transaction
markers, aborted records under read_committed, which librdkafka drops, and in a compacted
topic records the cleaner removed) when the gap lies at or above the partition's log
start: those offsets exist, or existed in a version of a key that a later one replaced,
but are not for the reader. A jump, or a range start, below the log start is *data loss*
(the records were deleted by retention or DeleteRecords): the read fails with
:class:`DataLossError`, or with ``failOnDataLoss=false`` logs a warning and skips to the
log start. The end of a range may itself be invisible data: the consumer's end-of-partition
event, whose offset is at or past ``end``, proves that nothing visible is left.

In a topic that is not compacted a jump is rare (one per transaction), and each is checked
against the log start asked of the broker then. In a compacted topic (the driver looks up
``cleanup.policy`` and marks the range) jumps are everywhere after a cleaning, so they are
taken as expected without a question each: the log start is checked when the read begins,
and the broker answers a fetch below its log start with OFFSET_OUT_OF_RANGE, which ends in
the same data-loss check, so records deleted while the range is read are still caught.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import confluent_kafka
import pyarrow as pa
from confluent_kafka import KafkaError

from pipeline import clients, lookups
from pipeline.options import KafkaOptions
from pipeline.schema import RowBuffer

log = logging.getLogger(__name__)
BATCH_ROWS = 10_000
POLL_BATCH = 1_000
WATERMARK_TIMEOUT_SECONDS = 30.0


_GONE = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC,
         KafkaError._UNKNOWN_PARTITION)
_FATAL = (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError._AUTHENTICATION,
          KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED,
          KafkaError._SSL)


class DataLossError(RuntimeError):
    """Offsets that should have been read are gone from the log."""


@dataclass(frozen=True)
class OffsetRange:
    """``[start, end)`` of one topic-partition."""

    topic: str
    partition: int
    start: int
    end: int
    compacted: bool = False
    """The topic's ``cleanup.policy`` includes ``compact``: gaps are expected in it."""

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition} [{self.start}, {self.end})"


def data_loss_message(where: OffsetRange, lost_from: int, lost_to: int, log_start: int) -> str:
    """The text of a data-loss error or warning."""
    return (f"edgekafka data loss in {where.topic}-{where.partition}: offsets "
            f"[{lost_from}, {lost_to}) are no longer in the log (log start offset {log_start}); "
            "they were deleted by retention or DeleteRecords before they were read. "
            "Set the option failOnDataLoss=false to skip lost offsets with a warning.")


class RangeReader:
    """Reads one :class:`OffsetRange` with one assign-only consumer."""

    def __init__(self, options: KafkaOptions, where: OffsetRange) -> None:
        self.options = options
        self.where = where
        self.position = where.start
        self.consumer = clients.consumer(options)

    def log_start(self) -> int:
        """The partition's log start offset, asked of the broker now."""
        return lookups.log_start(self.consumer, self.where.topic, self.where.partition,
                                 WATERMARK_TIMEOUT_SECONDS)

    def _lost(self, lost_to: int, log_start: int) -> None:
        """Offsets ``[position, lost_to)`` are gone: fail, or warn and move past them."""
        message = data_loss_message(self.where, self.position, lost_to, log_start)
        if self.options.fail_on_data_loss:
            raise DataLossError(message)
        log.warning("%s (skipped: failOnDataLoss=false)", message)
        self.position = lost_to

    def _seek(self) -> None:
        self.consumer.assign([confluent_kafka.TopicPartition(
            self.where.topic, self.where.partition, self.position)])

    def _check_start(self) -> None:
        log_start = self.log_start()
        if self.position < log_start:
            self._lost(min(log_start, self.where.end), log_start)

    def _gap(self, offset: int) -> None:
        """Nothing visible before ``offset``: the skipped offsets are invisible data
        (markers, aborted records) unless the log start moved past them."""
        if offset <= self.position:
            return
        if self.where.compacted:
            self.position = offset  # removed by the cleaner (see the module docstring)
            return
        log_start = self.log_start()
        if log_start > self.position:
            self._lost(min(log_start, offset), log_start)
        self.position = offset

    def _on_error(self, message: confluent_kafka.Message) -> bool:
        """Handle an error event; True when the range is complete."""
        error = message.error()
        assert error is not None
        code = error.code()
        if code == KafkaError._PARTITION_EOF:
            # Nothing visible before the event's offset: the rest of the range is invisible.
            eof = message.offset() or 0
            if eof >= self.where.end:
                self._gap(self.where.end)
                return True
            return False
        if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            log_start = self.log_start()
            # Below the log start: deleted. At or above it: past the log's end (the topic
            # was deleted and created again), so the rest of the range is gone too.
            self._lost(min(log_start, self.where.end) if log_start > self.position
                       else self.where.end, log_start)
            if self.position < self.where.end:
                self._seek()
            return self.position >= self.where.end
        if code in _GONE:
            message_text = (f"edgekafka data loss in {self.where.topic}-{self.where.partition}: "
                            f"offsets [{self.position}, {self.where.end}) cannot be read: "
                            f"{error.str()} (was the topic deleted?)")
            if self.options.fail_on_data_loss:
                raise DataLossError(message_text)
            log.warning("%s (skipped: failOnDataLoss=false)", message_text)
            self.position = self.where.end
            return True
        if error.fatal() or code in _FATAL:
            raise RuntimeError(f"edgekafka: reading {self.where} failed: {error.str()}")
        # Anything else (a lost connection, a leader change) librdkafka retries by itself;
        # pollTimeoutMs bounds the wait.
        log.warning("edgekafka: reading %s: %s (retrying)", self.where, error.str())
        return False

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The range's visible records as Arrow batches, in offset order."""
        try:
            yield from self._batches()
        finally:
            self.consumer.close()

    def _batches(self) -> Iterator[pa.RecordBatch]:
        end = self.where.end
        if self.position >= end:
            return
        self._check_start()
        if self.position >= end:
            return
        self._seek()
        rows = RowBuffer()
        timeout = self.options.poll_timeout_ms / 1000
        deadline = time.monotonic() + timeout
        while self.position < end:
            if time.monotonic() > deadline:
                raise TimeoutError(f"edgekafka: no progress reading {self.where} at offset "
                                   f"{self.position} within pollTimeoutMs={timeout * 1000:.0f}")
            done = False
            for message in self.consumer.consume(POLL_BATCH, 1.0):
                if message.error() is not None:
                    done = self._on_error(message)
                    if done:
                        break
                    continue
                offset = message.offset() or 0
                if offset < self.position:
                    continue  # already read (a re-fetch after a seek)
                if offset >= end:
                    self._gap(end)
                    done = True
                    break
                if offset > self.position:
                    self._gap(offset)
                rows.add(message)
                self.position = offset + 1
                deadline = time.monotonic() + timeout
                if len(rows) >= BATCH_ROWS:
                    yield rows.to_arrow()
                    rows = RowBuffer()
            if done:
                break
        if len(rows):
            yield rows.to_arrow()


def read_range(options: KafkaOptions, where: OffsetRange) -> Iterator[pa.RecordBatch]:
    """The visible records of ``where`` (see the module docstring for the checks)."""
    yield from RangeReader(options, where).batches()
