"""A streaming job for the exactly-once test, run in its own process (and process group)
so that the test can kill its driver and JVM: copies topic IN to topic OUT through the
``edgekafka`` source and sink, partition for partition, with ``Trigger.AvailableNow``.

    python -m tests.pipeline_copy_job BOOTSTRAP IN OUT CHECKPOINT [--slow SECONDS]
        [--slow-from N] [--atomicity batch|partition] [--max-offsets N]
        [--copy-pause-ms MS] [--fail-after N]

With --slow, every row of input partition 1 waits that long on its way to the sink (and
the sink gets rows in small Arrow batches through small buffers), so partition 0's task
finishes its share of a micro-batch while partition 1's is still writing; with
--slow-from N only the rows whose value ends in a number >= N (``...-N``) wait. --atomicity,
--max-offsets and --copy-pause-ms set the options ``atomicity``, ``maxOffsetsPerTrigger``
and ``copyPauseMs``. With --fail-after N, the job's pacing UDF raises at row N of input
partition 1 (the Spark task feeding the sink fails with the sink's input cut short,
the JVM alive)."""

from __future__ import annotations

import argparse
import sys
import time

from pyspark.sql.functions import udf

from pipeline.spark_session import spark_session
from tests.pipeline_helpers import SPARK_CONFIG


def main(args: argparse.Namespace) -> int:
    spark = spark_session("local[2]", app_name="edgekafka-copy-job", config={
        **SPARK_CONFIG, "spark.sql.execution.arrow.maxRecordsPerBatch": "10",
        "spark.buffer.size": "1024"})
    spark.sparkContext.setLogLevel("ERROR")
    slow: float = args.slow
    slow_from: int = args.slow_from
    fail_after: int = args.fail_after

    @udf("binary")
    def pace(partition: int, value: bytes) -> bytes:
        if partition == 1:
            number = int(value.split(b"-")[-1])
            if slow and number >= slow_from:
                time.sleep(slow)
            if fail_after and number >= fail_after:
                raise RuntimeError("pipeline_copy_job: --fail-after reached")
        return value

    reader = (spark.readStream.format("edgekafka")
              .option("kafka.bootstrap.servers", args.bootstrap)
              .option("subscribe", args.source).option("startingOffsets", "earliest"))
    if args.max_offsets:
        reader = reader.option("maxOffsetsPerTrigger", str(args.max_offsets))
    query = (reader.load().select("key", pace("partition", "value").alias("value"), "partition")
             .writeStream.format("edgekafka").option("kafka.bootstrap.servers", args.bootstrap)
             .option("topic", args.target).option("checkpointLocation", args.checkpoint)
             .option("atomicity", args.atomicity)
             .option("copyPauseMs", str(args.copy_pause_ms))
             .trigger(availableNow=True).start())
    print(f"copy job: query {query.id} started", file=sys.stderr, flush=True)
    query.awaitTermination()
    failure = query.exception()
    print(f"copy job: done ({failure or 'no error'})", file=sys.stderr, flush=True)
    spark.stop()
    return 1 if failure else 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.pipeline_copy_job")
    parser.add_argument("bootstrap")
    parser.add_argument("source")
    parser.add_argument("target")
    parser.add_argument("checkpoint")
    parser.add_argument("--slow", type=float, default=0.0)
    parser.add_argument("--slow-from", type=int, default=0)
    parser.add_argument("--atomicity", default="batch")
    parser.add_argument("--max-offsets", type=int, default=0)
    parser.add_argument("--copy-pause-ms", type=int, default=0)
    parser.add_argument("--fail-after", type=int, default=0)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main(parse_args(sys.argv[1:])))
