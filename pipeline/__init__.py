"""The PySpark data source ``edgekafka`` (Kafka topics read and written over the Kafka
protocol through confluent-kafka, batch and streaming) and the jobs that run on Spark,
such as the audit report. Imports nothing from the broker: it speaks Kafka protocol only.

Start with :func:`pipeline.spark_session.spark_session` (or register
:class:`pipeline.source.EdgeKafkaDataSource` in your own session with
:func:`pipeline.spark_session.register`).
"""
