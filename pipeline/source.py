"""The ``edgekafka`` Python data source: Kafka topics as Spark DataFrames, batch and
streaming, read and written through a real Kafka client (confluent-kafka)."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from pipeline.batch_reader import BatchReader
from pipeline.options import OptionError, parse_options
from pipeline.schema import SCHEMA
from pipeline.sink import BatchWriter, StreamWriter
from pipeline.stream_reader import StreamReader

SHORT_NAME = "edgekafka"


class EdgeKafkaDataSource(DataSource):
    """``spark.read.format("edgekafka")``, ``readStream``, ``write`` and ``writeStream``."""

    @classmethod
    def name(cls) -> str:
        """The short name for ``format()``."""
        return SHORT_NAME

    def schema(self) -> StructType:
        """Spark's Kafka source row: key, value, topic, partition, offset, timestamp,
        timestampType, headers."""
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch reader."""
        return BatchReader(parse_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A micro-batch reader."""
        return StreamReader(parse_options(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """A batch writer (appends; Kafka has nothing to overwrite)."""
        if overwrite:
            raise OptionError('the edgekafka sink only appends: use .mode("append")')
        return BatchWriter(parse_options(self.options, reading=False), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """A streaming writer (in complete mode every micro-batch writes all its rows)."""
        return StreamWriter(parse_options(self.options, reading=False), schema)
