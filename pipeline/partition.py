"""The unit of work a Spark task reads: one offset range and the options to reach it."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from pipeline.fetch import OffsetRange, read_range
from pipeline.options import KafkaOptions


class RangePartition(InputPartition):
    """One topic-partition's ``[start, end)``; pickled to the executor that reads it."""

    def __init__(self, options: KafkaOptions, where: OffsetRange) -> None:
        super().__init__(where)
        self.options = options
        self.where = where

    def __repr__(self) -> str:  # the options hold credentials: keep them out of logs
        return f"RangePartition({self.where})"


def read_partition(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """The records of a :class:`RangePartition` (nothing for Spark's empty placeholder)."""
    if isinstance(partition, RangePartition):
        yield from read_range(partition.options, partition.where)
