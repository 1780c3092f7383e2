"""Streaming reads: ``spark.readStream.format("edgekafka")``, micro-batch by micro-batch.

The checkpointed offset is ``{"topic": {"partition": next offset}}``. Each micro-batch
reads ``[previous end, new end)`` per topic-partition, where the new end is the latest
offset (the last stable offset under read_committed), cut down by the read limit
(``maxOffsetsPerTrigger``, shared among partitions in proportion to their backlog) and,
under ``Trigger.AvailableNow``, by the offsets seen when the query started. Partitions
that appear later enter the offset log at their earliest offset (the end of the batch
that finds them), so the next batches read them from there and a replay plans the same
ranges; one whose earliest offset is not 0 lost records before the stream saw it. A
partition the stream was reading that is gone (its topic deleted) is data loss too; both
fail the query, or with ``failOnDataLoss=false`` log a warning and go on (a gone
partition is dropped from the offsets). Spark calls these methods in one long-lived
Python process on the driver; ``read`` runs in the executors.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pipeline.fetch import DataLossError, OffsetRange
from pipeline.metadata import ClusterView
from pipeline.offsets import (
    EARLIEST,
    Offsets,
    TopicPartition,
    from_json,
    parse_spec,
    rate_limit,
    to_json,
)
from pipeline.options import KafkaOptions, OptionError
from pipeline.partition import RangePartition, read_partition

log = logging.getLogger(__name__)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver from the subscription's offsets."""

    def __init__(self, options: KafkaOptions) -> None:
        if options.ending is not None:
            raise OptionError("option endingOffsets is for batch reads only: a stream has "
                              "no end (Trigger.AvailableNow stops at the offsets of its start)")
        self.options = options
        self._view: ClusterView | None = None
        self._target: Offsets | None = None
        self._latest: Offsets | None = None

    def __getstate__(self) -> dict[str, object]:
        return {"options": self.options, "_view": None, "_target": None, "_latest": None}

    @property
    def view(self) -> ClusterView:
        """The driver's clients, opened on first use."""
        if self._view is None:
            self._view = ClusterView(self.options)
        return self._view

    def initialOffset(self) -> dict[str, dict[str, int]]:
        """Where a new query starts: ``startingOffsets`` (default latest) or
        ``startingTimestamp``."""
        options, view = self.options, self.view
        tps = view.partitions()
        if options.assign is not None:
            view.check_named(((t, p) for t, parts in options.assign.items() for p in parts),
                             tps, "assign")
        if options.starting_timestamp is not None:
            return to_json(view.for_timestamp(tps, options.starting_timestamp))
        spec = parse_spec(options.starting, "latest", "startingOffsets")
        if isinstance(spec, dict):
            view.check_named(spec, tps, "startingOffsets")
        return to_json(view.resolve(spec, tps, EARLIEST))

    def _data_loss(self, message: str) -> None:
        """Fail with ``message`` (``failOnDataLoss=true``) or log it as a warning."""
        if self.options.fail_on_data_loss:
            raise DataLossError(f"{message}. Set the option failOnDataLoss=false to go on "
                                "with a warning.")
        log.warning("%s (going on: failOnDataLoss=false)", message)

    def _begin_and_latest(self, start: Offsets) -> tuple[Offsets, Offsets, set[TopicPartition]]:
        """Start offsets without the partitions that are gone and with those newly found
        (at their earliest), the latest offsets of every partition, and the new ones."""
        tps = self.view.partitions()
        known = set(tps)
        gone = sorted(tp for tp in start if tp not in known)
        if gone:
            self._data_loss(
                "edgekafka data loss: " + ", ".join(f"{t}-{p}" for t, p in gone)
                + " (read up to offsets " + ", ".join(str(start[tp]) for tp in gone)
                + ") no longer exist (was the topic deleted?); records after those offsets "
                "may never have been read")
        new = [tp for tp in tps if tp not in start]
        found = self.view.earliest(new)
        for (topic, partition), first in sorted(found.items()):
            if first > 0:
                self._data_loss(f"edgekafka data loss: added partition {topic}-{partition} "
                                f"starts from offset {first} instead of 0: its first "
                                "records were deleted before the stream saw them")
        if new:
            log.info("edgekafka: new partitions %s start at %s", new, found)
        begin = {tp: offset for tp, offset in start.items() if tp in known} | found
        latest = self.view.latest(tps)
        self._latest = latest
        return begin, latest, set(new)

    def latestOffset(self, start: dict[str, dict[str, int]],
                     limit: ReadLimit) -> dict[str, dict[str, int]]:
        """The end of the next micro-batch. A new partition ends it at its start: the
        offset log records where it starts, and the next batch reads it."""
        begin, latest, new = self._begin_and_latest(from_json(start))
        latest |= {tp: begin[tp] for tp in new}
        if self._target is not None:
            target = self._target
            latest = {tp: min(offset, target[tp]) if tp in target else begin[tp]
                      for tp, offset in latest.items()}
        if isinstance(limit, ReadMaxRows):
            return to_json(rate_limit(begin, latest, limit.max_rows))
        return to_json(latest)

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxOffsetsPerTrigger`` as a row limit, else everything available."""
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        """The latest offsets seen by the last planning, for the query's progress."""
        return None if self._latest is None else to_json(self._latest)

    def prepareForTriggerAvailableNow(self) -> None:
        """Remember today's latest offsets: an AvailableNow query stops there."""
        tps = self.view.partitions()
        self._target = self.view.latest(tps)

    def partitions(self, start: dict[str, dict[str, int]],
                   end: dict[str, dict[str, int]]) -> Sequence[InputPartition]:
        """One range per topic-partition that moved."""
        begin, stop = from_json(start), from_json(end)
        new = [tp for tp in stop if tp not in begin]  # found by this batch: it ends at its
        begin |= {tp: min(first, stop[tp])  # start (earlier versions: read from earliest)
                  for tp, first in self.view.earliest(new).items()}
        ranges: list[InputPartition] = []
        compacted = self.view.compacted({t for (t, p), last in stop.items()
                                         if begin[t, p] < last})
        for (topic, partition), last in sorted(stop.items()):
            first = begin[topic, partition]
            where = OffsetRange(topic, partition, first, last, topic in compacted)
            if last < first:
                message = (f"edgekafka data loss in {topic}-{partition}: its latest offset "
                           f"went back from {first} to {last} (was the topic deleted and "
                           "created again?). Set the option failOnDataLoss=false to go on "
                           "from the new offsets with a warning.")
                if self.options.fail_on_data_loss:
                    raise DataLossError(message)
                log.warning("%s (skipped: failOnDataLoss=false)", message)
            elif first < last:
                ranges.append(RangePartition(self.options, where))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The records of one range (runs in an executor)."""
        return read_partition(partition)

    def commit(self, end: dict[str, dict[str, int]]) -> None:
        """Nothing to do: the checkpoint is the only record of progress."""

    def stop(self) -> None:
        """Close the driver's clients."""
        if self._view is not None:
            self._view.close()
            self._view = None
