"""Batch reads: ``spark.read.format("edgekafka")`` over ``[startingOffsets, endingOffsets)``.

Defaults are Spark's: from the earliest to the latest offset (the last stable offset under
read_committed). One Spark partition per topic-partition with records in range.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from pipeline.fetch import OffsetRange
from pipeline.metadata import ClusterView
from pipeline.offsets import EARLIEST, LATEST, parse_spec
from pipeline.options import KafkaOptions, OptionError
from pipeline.partition import RangePartition, read_partition


class BatchReader(DataSourceReader):
    """Plans offset ranges on the driver; each task reads its range."""

    def __init__(self, options: KafkaOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        """One :class:`RangePartition` per topic-partition with offsets to read."""
        options = self.options
        starting = parse_spec(options.starting, "earliest", "startingOffsets")
        ending = parse_spec(options.ending, "latest", "endingOffsets")
        if starting == "latest":
            raise OptionError("startingOffsets=latest makes no sense for a batch read")
        if ending == "earliest":
            raise OptionError("endingOffsets=earliest makes no sense for a batch read")
        view = ClusterView(options)
        try:
            tps = view.partitions()
            if isinstance(starting, dict):
                tps = sorted(set(tps) | set(starting))
            if isinstance(ending, dict):
                tps = sorted(set(tps) | set(ending))
            if options.starting_timestamp is not None:
                start = view.for_timestamp(tps, options.starting_timestamp)
            else:
                start = view.resolve(starting, tps, EARLIEST)
            end = view.resolve(ending, tps, LATEST)
            compacted = view.compacted({t for t, p in tps if start[t, p] < end[t, p]})
        finally:
            view.close()
        ranges: list[InputPartition] = []
        for topic, partition in tps:
            begin, stop = start[topic, partition], end[topic, partition]
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
