"""Batch reads: ``spark.read.format("edgekafka")`` over ``[startingOffsets, endingOffsets)``.

Defaults are Spark's: from the earliest to the latest offset (the last stable offset under
read_committed). One Spark partition per topic-partition with records in range. Offsets
Spark refuses for a batch (``latest``/-1 to start, ``earliest``/-2 to end), an end past a
partition's latest offset (the read would wait for records that may never come) and
JSON or ``assign`` naming partitions outside the subscription or unknown to the broker
are refused by name before anything is read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from pipeline.fetch import OffsetRange
from pipeline.metadata import ClusterView
from pipeline.offsets import EARLIEST, LATEST, Spec, parse_spec
from pipeline.options import KafkaOptions, OptionError
from pipeline.partition import RangePartition, read_partition


def _refuse(spec: Spec, offset: int, option: str, name: str) -> None:
    """Refuse ``option`` = ``name`` (or its JSON stand-in ``offset``) for a batch read, as
    Spark does."""
    if spec == name or (isinstance(spec, dict) and offset in spec.values()):
        raise OptionError(f"option {option} cannot be {name} ({offset} in JSON) for a batch "
                          "read")


class BatchReader(DataSourceReader):
    """Plans offset ranges on the driver; each task reads its range."""

    def __init__(self, options: KafkaOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        """One :class:`RangePartition` per topic-partition with offsets to read."""
        options = self.options
        starting = parse_spec(options.starting, "earliest", "startingOffsets")
        ending = parse_spec(options.ending, "latest", "endingOffsets")
        _refuse(starting, LATEST, "startingOffsets", "latest")
        _refuse(ending, EARLIEST, "endingOffsets", "earliest")
        view = ClusterView(options)
        try:
            tps = view.partitions()
            if options.assign is not None:
                view.check_named(((t, p) for t, parts in options.assign.items()
                                  for p in parts), tps, "assign")
            for name, spec in (("startingOffsets", starting), ("endingOffsets", ending)):
                if isinstance(spec, dict):
                    view.check_named(spec, tps, name)
            if options.starting_timestamp is not None:
                start = view.for_timestamp(tps, options.starting_timestamp)
            else:
                start = view.resolve(starting, tps, EARLIEST)
            end = view.resolve(ending, tps, LATEST)
            latest = end if ending == "latest" else view.latest(tps)
            compacted = view.compacted({t for t, p in tps if start[t, p] < end[t, p]})
        finally:
            view.close()
        ranges: list[InputPartition] = []
        for topic, partition in tps:
            begin, stop = start[topic, partition], end[topic, partition]
            if stop > latest[topic, partition]:
                raise OptionError(
                    f"option endingOffsets: {topic}-{partition} ends at offset {stop}, past "
                    f"its latest offset {latest[topic, partition]}"
                    + (" (the last stable offset: read_committed)"
                       if options.isolation_level == "read_committed" else "")
                    + ": a batch read cannot wait for records to come")
            if begin > stop:
                raise OptionError(f"edgekafka: {topic}-{partition} starts at offset {begin}, "
                                  f"after its ending offset {stop}")
            if begin < stop:
                ranges.append(RangePartition(options, OffsetRange(
                    topic, partition, begin, stop, topic in compacted)))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The records of one range."""
        return read_partition(partition)
