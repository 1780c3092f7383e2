"""A streaming job for the exactly-once test, run in its own process (and process group)
so that the test can kill its driver and JVM: copies topic IN to topic OUT through the
``edgekafka`` source and sink, partition for partition, with ``Trigger.AvailableNow``.

    python -m tests.pipeline_copy_job BOOTSTRAP IN OUT CHECKPOINT [SLOW_SECONDS]

With SLOW_SECONDS, every row of input partition 1 waits that long on its way to the sink
(and the sink gets rows in small Arrow batches through small buffers), so partition 0's
task commits its transaction while partition 1's is still open."""

from __future__ import annotations

import sys
import time

from pyspark.sql.functions import udf

from pipeline.spark_session import spark_session
from tests.pipeline_helpers import SPARK_CONFIG


def main(bootstrap: str, source: str, target: str, checkpoint: str, slow: float) -> int:
    spark = spark_session("local[2]", app_name="edgekafka-copy-job", config={
        **SPARK_CONFIG, "spark.sql.execution.arrow.maxRecordsPerBatch": "10",
        "spark.buffer.size": "1024"})
    spark.sparkContext.setLogLevel("ERROR")

    @udf("binary")
    def pace(partition: int, value: bytes) -> bytes:
        if slow and partition == 1:
            time.sleep(slow)
        return value

    frame = (spark.readStream.format("edgekafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", source).option("startingOffsets", "earliest").load())
    query = (frame.select("key", pace("partition", "value").alias("value"), "partition")
             .writeStream.format("edgekafka").option("kafka.bootstrap.servers", bootstrap)
             .option("topic", target).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    print(f"copy job: query {query.id} started", file=sys.stderr, flush=True)
    query.awaitTermination()
    failure = query.exception()
    print(f"copy job: done ({failure or 'no error'})", file=sys.stderr, flush=True)
    spark.stop()
    return 1 if failure else 0


if __name__ == "__main__":
    bootstrap, source, target, checkpoint, *slow = sys.argv[1:]
    sys.exit(main(bootstrap, source, target, checkpoint, float(slow[0]) if slow else 0.0))
